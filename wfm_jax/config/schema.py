"""The config schema: every key wfm_jax knows, with its default, in one nested dict.

To add a key: add it to DEFAULTS below (its default fixes its type; use
`config_dict.placeholder(T)` for a typed key whose default is None), and, if it takes one of a
fixed set of values, list them in CHOICES. Cross-key rules go in wfm_jax/config/checks.py, in a
function decorated with `@register_check`. Names follow cosmos-rl where it has one (see
shared/specs/cosmos_rl_reference.md); defaults follow shared/specs/algorithms.md (SD3.5-Medium NFT
recipe) where it gives one.
"""
from __future__ import annotations

import copy

import ml_collections
from ml_collections.config_dict import placeholder

from wfm_jax.families import cosmos as cosmos_family
from wfm_jax.families import sana as sana_family
from wfm_jax.families import sd3 as sd3_family
from wfm_jax.families import wan as wan_family

# Each family's LoRA targets live with the family (`FAMILIES.get(f).lora_targets`, from its
# light package module so the schema imports no model); these names stay for the recipes.
SD3_LORA_TARGETS = sd3_family.LORA_TARGETS
WAN_LORA_TARGETS = wan_family.LORA_TARGETS
SANA_LORA_TARGETS = sana_family.LORA_TARGETS
COSMOS_LORA_TARGETS = cosmos_family.LORA_TARGETS
# vision-language families (policy.family): trained by wfm_jax.train.vlm_sft, configured by policy.vlm
VLM_FAMILIES = ("qwen3_vl",)
# Qwen3-VL's text decoder linears (peft names); add "qkv", "proj", "linear_fc1/2" for the vision tower
QWEN3_VL_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

DEFAULTS = {
    "train": {
        "output_dir": "./outputs",
        # the run's length (config/run_length.py, cosmos-rl's rule): max_steps steps, or epoch
        # passes over the training set, or the smaller of the two when both are set; neither:
        # one pass. Unset max_steps is resolved from the data when the run starts (config.json
        # records the number)
        "max_steps": placeholder(int),  # cosmos-rl's train.max_num_steps
        "seed": 42,
        "resume": False,              # True: continue from the latest checkpoint in output_dir
        "epoch": placeholder(int),
        "param_dtype": "float32",     # master weights
        "compute_dtype": "bfloat16",  # matmuls / activations; timesteps, norms, losses stay fp32
        "train_batch_per_replica": 8,  # GLOBAL batch (cosmos-rl name), summed over all devices
        "optm_lr": 3e-4,
        "optm_weight_decay": 1e-4,
        "optm_betas": (0.9, 0.999),
        "optm_eps": 1e-8,
        "optm_grad_norm_clip": 1.0,
        "optm_warmup_steps": 0,
        "lr_schedule": "constant",
        "grad_accum_steps": 1,
        "ema_enable": False,
        "ema_decay": 0.9,
        "ema_update_step_interval": 1,  # 0 = never update (no crash, unlike cosmos-rl)
        "log_freq": 1,
        "wandb": {"enable": False, "project": "wfm_jax", "name": "", "mode": "online"},
        "ckpt": {"save_freq": 20, "save_mode": "async", "max_keep": 5, "export_safetensors": True,
                 # newest safetensors/step_N exports kept: None = max_keep, 0 = every export
                 "export_max_keep": placeholder(int),
                 # mirror checkpoints and exports to s3://s3_bucket/s3_prefix/ (cosmos-rl's
                 # keys): "" off, "final" the last ones, "all" each one; credentials from
                 # PROD_S3_CHECKPOINT_* / AWS_* (README); resume reads the newest committed step
                 "upload_s3": "", "s3_bucket": "", "s3_prefix": "outputs"},
        "train_policy": {
            "type": "sft",
            "dataset": {
                "local_dir": "",       # paired / wfm dir, or RL prompt file / dir
                "layout": "paired",
                "allow_pickle": False,  # .pickle text embeddings run code when loaded
                "build_tiny": False,    # generate the tiny shapes dataset at local_dir if absent
                # ... of this split's scenes (worlds/shapes/grammar.py SPLIT_SCENES; the sized
                # splits' captions say the size drawn) in this layout (random, or fixed: the
                # pretrained base's world)
                "build_tiny_split": "train", "build_tiny_layout": "random",
                "build_tiny_count": 16,  # items built (a folder holding another count is refused)
                # WebDataset split layout's data keys (one tar tree each, e.g. video, metas,
                # t5_xxl); empty: paired tars, or the key dirs found under local_dir
                "wds_keys": (),
                # layout "mock" (cosmos-rl's mock-data mode, wfm_jax.data.mock): random videos of
                # the recipe's shape and random T5-like text embeddings of this width
                # (policy.diffusers.max_prompt_length tokens); the DiT's text width wins when
                # they differ (said in one line)
                "mock_text_dim": 1024,
            },
            # SFT: keep each distinct prompt's text conditioning and each distinct item's VAE
            # posterior (mean, std; the per-step draw is unchanged, so losses are bit-equal) in
            # host RAM, so T5/CLIP and the VAE encoder run once per prompt / item. Costs per
            # prompt the conditioning (SD3.5, 256 T5 tokens: 333 x 4096 f32 = 5.5 MB) and per
            # item 2 latents (SD3.5 1024^2: 2 x 16 x 128 x 128 f32 = 2 MB). Leave off for huge
            # datasets (RAM) and random augmentations / video windows (every draw is a miss)
            "cache_encodings": False,
            "mini_batch": 1,
            "mu_iterations": 1,
            # rows per optimizer update within an inner epoch (None: the whole batch); a multiple
            # of mini_batch x data-parallel devices that divides train_batch_per_replica
            "batch_size_per_optimize": placeholder(int),
            "kl_beta": 1e-4,
            # advantages are clipped once to [advantage_low, advantage_high] (all algorithms);
            # NFT's optimality r divides by advantage_high, as cosmos-rl does
            "advantage_low": -5.0,
            "advantage_high": 5.0,
            "timesteps_fraction": 0.99,  # cosmos-rl recipes misspell this 'timestep_fraction'
            # NFT / GRPO advantages: per-prompt mean, divided by the std of the whole batch
            # (True: NVlabs DiffusionNFT, flow_grpo) or of the prompt's group (False: cosmos-rl's
            # remote-reward path, with std_ddof=1, torch's unbiased std)
            "global_std": True,
            "std_ddof": 0,
            # Flow-GRPO: CFG's unconditional branch under stop_gradient in the update (flow_grpo
            # until mid 2025; its later code back-propagates through both branches: False)
            "cfg_detach_uncond": True,
            # Flow-GRPO: leave samples whose advantage is exactly 0 out of the loss means
            # (flow_grpo drops them before batching; here the batch keeps its shape)
            "filter_zero_advantage": False,
            # Flow-GRPO / DDRL (spec algorithms.md §2, §4)
            "clip_range": 1e-4,            # PPO ratio clip (DDRL's clip_ratio)
            "train_on": tuple(range(0, 20, 2)),  # DDRL: trained steps; -1 = a random other step
            "data_beta": 0.01,             # DDRL: weight of the diffusion loss on real data
            "use_rl_sigma_and_noise": True,  # DDRL data loss at the rollout's sigma and noise
            "data_on_first_only": False,   # DDRL data loss on the first trained step only
            "exp_reward": False,           # DDRL advantages A -> -exp(-A) (cosmos-rl: off)
            "update_ref_every_iter": 16,   # DDRL: copy the policy into the KL reference (0: never)
            "loss_scale": 10.0,            # DDRL total-loss factor
            # DDRL: "none" (cosmos-rl) leaves each trained step's log-ratio unscaled, so its
            # gradient grows with the step's noise; "std" divides it by the step's transition std
            "log_ratio_norm": "none",
            "data_sigma_p_mean": 1.3862943611198906,  # log 4: DDRL data sigma ~ lognormal
            "data_sigma_p_std": 1.2,
            # GRPO of the vision-language model (policy.family in VLM_FAMILIES, type "grpo";
            # train/vlm_grpo.py, specs/reason2.md §4.2): cosmos-rl's train_policy / rollout keys for
            # language models, their defaults. The group size is rollout.n_generation, the prompts
            # per step train_batch_per_replica / n_generation; mini_batch, mu_iterations and
            # batch_size_per_optimize are the keys above
            "lm_grpo": {
                "epsilon_low": 0.2, "epsilon_high": 0.2, "lower_bound_ratio": 3.0,
                "kl_beta": 0.0,                # > 0: k3 KL to the starting policy
                "unbiased_kl_estimate": False,
                "loss_type": "token-mean",     # | seq-mean-token-mean | seq-mean-token-sum | token-sum
                "unbiased_loss_max_tokens": placeholder(int),
                "unbiased_advantage": False,
                "temperature": 1.0,            # divides the policy logits in the loss, and samples
                # rollout.sampling_config.temperature: None samples at `temperature` (cosmos-rl
                # samples at this one and scores at `temperature`; its Reason1 recipe: 1.0 / 0.9)
                "sampling_temperature": placeholder(float),
                # cosmos-rl's min_filter_prefix_tokens: in a group of mixed rewards, completions
                # sharing a prefix of at least this many tokens leave it out of the loss (None: off)
                "min_filter_prefix_tokens": placeholder(int),
                # cosmos-rl's train_policy.variant: "grpo" trains on every group (one of equal
                # rewards with advantage 0, its tokens in the token-mean); "dapo" drops the groups
                # whose filter_reward_metric rewards are all equal and draws more prompts until the
                # step is full, at most max_retry_for_on_policy draws (<= 0: until the dataset's
                # prompts are used up)
                "variant": "grpo",
                "filter_reward_metric": (),    # names among `rewards`, each of weight 1
                "max_retry_for_on_policy": -1,
                "top_p": 1.0, "top_k": -1,     # rollout.sampling_config (-1: no top-k)
                "max_response_length": 32,     # rollout.max_response_length (new tokens)
                # the weighted sum of these text rewards (reward_client.reason; the record's
                # "answer" is the reference)
                "rewards": ("format", "single_choice"),
                "reward_weights": (1.0, 1.0),
            },
            # wfm_rl: cosmos-rl's world-model RL step (its "GRPO" and DDRL recipes), keys as
            # cosmos-rl's [model.rl] / model.loss_scale / [model.sde] name them, its defaults
            # (what the "GRPO" recipes run). The group size is rollout.n_generation (num_rollout),
            # the conditional frames policy.diffusers.{min,max}_num_conditional_frames, the
            # advantage clamp advantage_low / advantage_high (adv_clip_min / adv_clip_max)
            "wfm": {
                "sample_steps": 10,
                "train_on": tuple(range(8)),   # trained trajectory steps; -1 = a random other one
                "kl_beta": 0.01,
                "data_beta": 0.0,
                "clip_ratio": 1e-4,
                "update_ref_every_iter": 16,   # copy the policy into the reference (0: never)
                "use_same_seed": True,         # one initial noise per group
                "guidance": 0.0,               # cosmos form x0 = c + g (c - u); 0: no CFG
                "solver_option": "2ab",
                "s_churn": 1.0, "s_noise": 1.0, "s_t_min": 0.0, "s_t_max": float("inf"),
                "on_policy": True,
                "exp_reward": False,
                "use_rl_sigma_and_noise": True,
                "data_on_first_only": False,
                "loss_scale": 10.0,            # model.loss_scale
                "sigma_min": 0.01, "sigma_max": 200.0,  # model.sde
                "p_mean": 1.3862943611198906, "p_std": 1.2,
                # [[model.conditioner]] text dropout_rate (DDRL 0.2): per sample, the data
                # loss's text embeddings are zeroed with this probability; rollout, policy
                # and KL terms always see the text
                "text_dropout_rate": 0.0,
            },
            "use_remote_reward": False,
            "remote_reward": {
                "enqueue_url": "",  # empty: REMOTE_REWARD_ENQUEUE_URL (or WFM_REWARD_*) env
                "fetch_url": "",
                "token": "",
                "scale": 1.0,
                "clip": 5.0,
                "on_failure": "raise",  # "drop": drop prompt groups whose reward failed, counted
                # seconds for one batch's enqueue + pulls; a task the service dropped shows up
                # as 'not ready' until this runs out
                "budget_s": 1800.0,
                # what the rollouts go to the rewards as: "pixels" (decoded; images, or videos
                # [B,C,T,H,W] by their shape) or "latent" (the normalised VAE latents, float16,
                # as cosmos-rl's video trainer sends them; the service decodes them, e.g.
                # python -m reward_client.server --pipeline DIR; remote rewards only)
                "media_type": "pixels",
                # per entry: name, weight, score_key ("a+b" sums keys), clip_min / clip_max
                # (cosmos-rl's per-function clip before weighting, default [-5, 5])
                "reward_fns": [{"name": "jpeg_compressibility", "weight": 1.0, "score_key": ""}],
            },
        },
    },
    "policy": {
        "model_name_or_path": "",
        # the recipe's model family (a wfm_jax.families.FAMILIES name): the pipeline dir must hold one
        "family": "sd3",
        "build_tiny": False,  # embedded defaults: build the tiny random pipeline there if missing
        # tiny RL recipes: build (or rebuild an incomplete) pretrained tiny shapes pipeline there
        "build_tiny_pretrained": False,
        "lora": {
            "enable": False,
            "r": 32,
            "lora_alpha": 64,
            "init_lora_weights": "gaussian",
            "target_modules": SD3_LORA_TARGETS,
        },
        "diffusers": {
            "is_video": False,
            "max_prompt_length": 128,
            "inference_size": (512, 512),  # (H, W)
            "train_frames": 16,
            "inference_frames": 16,
            "weighting_scheme": "logit_normal",
            "logit_mean": 0.0,
            "logit_std": 1.0,
            "mode_scale": 1.29,
            "nft_beta": 1.0,
            # video2world in training (cosmos-rl's names): each data item is conditioned on the
            # first n latent frames of its clip, n uniform in [min, max] per item (0: text2world);
            # needs a family with video conditioning and a trainer reading videos (DDRL, SFT)
            "min_num_conditional_frames": 0,
            "max_num_conditional_frames": 0,
            "weight_copy_decay_type": 1,
            "sample": {
                "num_steps": 10,
                "eval_num_steps": 40,
                "guidance_scale": 1.0,
                "noise_level": 0.7,
                "solver": "dpm2",
                "deterministic_sampling": True,
                "sde_window_size": 0,          # Flow-GRPO-Fast: stochastic window length (0: off)
                "sde_window_range": (0, 10),   # window start uniform in [lo, hi - size]
                "s_churn": 1.0,                # DDRL EDM sampler churn (EDM Alg. 2)
                "s_noise": 1.0,
                "s_tmin": 0.0,
                "s_tmax": 1e9,                 # churn where s_tmin < sigma < s_tmax
                "edm_sigma_min": 0.01,
                "edm_sigma_max": 200.0,
                "edm_rho": 7.0,
            },
        },
        "parallelism": {"data": -1, "fsdp": 1, "context": 1},  # -1: all devices left over
        # cuDNN flash attention on NVIDIA GPUs (bf16), Pallas flash on TPU, else XLA below 2048
        # tokens and blockwise (flash-style, pure JAX) from there; or xla|cudnn|blockwise|pallas
        "attention_impl": "auto",
        # tokens split over parallelism.context: ulysses (all-to-all heads <-> sequence), ring
        # (K/V rotated round the devices), auto (ulysses when the heads divide, else ring)
        "context_parallel_impl": "auto",
        # per block, a jax.checkpoint_policies name: everything_saveable (no remat) |
        # nothing_saveable | dots_with_no_batch_dims_saveable | dots_saveable |
        # offload_dot_with_no_batch_dims (GPU/TPU); see models/layers/remat.py
        "remat": "everything_saveable",
        "scan_layers": True,  # runs of identical blocks as one lax.scan (same checkpoint layout)
        # DiTs: each norm and AdaLN helper as its own jax.checkpoint keeping only its inputs and
        # per-row statistics (models/layers/norms.py): the same numbers; memory and time by program
        "norm_checkpoints": True,
        # vision-language SFT (policy.family in VLM_FAMILIES; specs/reason2.md §4.1); data:
        # train.train_policy.dataset.local_dir, layout "conversations" (LLaVA JSON dir / file,
        # or WebDataset tar shards, local or s3://); held-out accuracy: validation.dataset.local_dir
        "vlm": {
            "model_max_length": 4096,  # cosmos-rl policy.model_max_length: longer rows are cut
            "train_vision": True,      # False: the vision tower (model.visual) stays frozen
            "system_prompt": "",       # a system turn before each conversation ("" none)
            # the records' image / video paths are relative to this ("": the annotation file's
            # dir; cosmos-reason2's custom.dataset.media_path)
            "media_root": "",
            "pad_to_multiple": 8,      # batch lengths rounded up: fewer distinct programs
            "max_new_tokens": 32,      # greedy answer length for val/accuracy
            # the tiny VQA world (wfm_jax.worlds.vqa): build the tiny random model at
            # policy.model_name_or_path and the train / held-out sets at the dataset dirs if absent
            "build_tiny_vqa": False,
            "vqa_types": ("colour", "shape", "background"),
            "vqa_train_count": 512,
            "vqa_val_count": 64,
            "vqa_seed": 0,
            # steps of the base model's pre-training on describing pictures (train/vlm_sft.py
            # pretrain_tiny_base; 0: the random model is the base)
            "vqa_pretrain_steps": 600,
            # the SFT answers' think text: "fixed" (spec §7), "answer" (the answer's text, then
            # its letter) or "look" (what to look at, then the answer's text; worlds/vqa/scenes.py
            # TARGET_STYLES)
            "vqa_target": "look",
            # mixed reasoning: this share of the SFT answers think the fixed sentence instead of
            # vqa_target's (drawn per record; worlds/vqa/dataset.py think_style)
            "vqa_fixed_think_fraction": 0.0,
            # the options' order: "shuffled" per question, or "fixed" (one order per question
            # type, so the letter is a lookup; worlds/vqa/scenes.py OPTION_ORDERS)
            "vqa_options": "shuffled",
        },
    },
    # batch_size: VLM GRPO, prompts per generate call (x n_generation rows; None: the whole
    # step's); the rollout's memory is one call's (cosmos-rl's rollout.batch_size)
    "rollout": {"n_generation": 24, "batch_size": placeholder(int)},
    "validation": {
        "enable": False,
        "val_before_train": False,
        "freq": 20,
        "batch_size": 8,
        "dataset": {
            "local_dir": "",          # validation prompt file / dir; empty: see holdout_fraction
            "holdout_fraction": 0.0,  # > 0: hold out this fraction of the training prompts
        },
    },
    # the hardware the recipe is meant for and planned to fit (python -m wfm_jax.plan --config X
    # plans there when given no --topology / --devices): a TPU topology "v5p:2x2x1" (any of
    # config/targets.py's TPU_TARGET_KINDS, 2-3 dims) or GPUs "h100:8" (its GPU_TARGET_KINDS); "" none
    "plan": {"target": ""},
    "distributed": {  # None: from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID
        "coordinator_address": placeholder(str),
        "num_processes": placeholder(int),
        "process_id": placeholder(int),
    },
    "data": {
        "skip_bad_samples": False,  # corrupt media: skipped and counted instead of an error
        "num_workers": 0,           # grain worker processes (0: load in the main process)
        "prefetch_buffer_size": 2,
        "shuffle": True,
        "cycle_length": 4,          # WebDataset shards read at once (interleaved) per process
        "shuffle_window": 16,       # WebDataset samples shuffled together (in memory; 0/1: off)
    },
}

# dotted key -> allowed values
CHOICES = {
    "train.param_dtype": ("float32", "bfloat16", "float16"),
    "train.compute_dtype": ("float32", "bfloat16", "float16"),
    "train.lr_schedule": ("constant", "cosine"),
    "train.wandb.mode": ("online", "offline", "disabled"),
    "train.ckpt.save_mode": ("async", "sync"),
    "train.ckpt.upload_s3": ("", "final", "all"),
    "train.train_policy.type": ("sft", "nft", "grpo", "ddrl", "wfm_rl"),
    "train.train_policy.wfm.solver_option": ("2ab", "1euler", "2heun_edm"),
    "train.train_policy.log_ratio_norm": ("none", "std"),  # algorithms/ddrl/loss.py LOG_RATIO_NORMS
    "train.train_policy.remote_reward.on_failure": ("raise", "drop"),
    "train.train_policy.remote_reward.media_type": ("pixels", "latent"),
    "train.train_policy.dataset.layout": ("paired", "wfm", "prompts", "mock", "conversations"),
    "train.train_policy.dataset.build_tiny_split": ("train", "heldout", "all", "train_sized",
                                                    "heldout_sized"),  # grammar.SPLIT_SCENES
    "train.train_policy.dataset.build_tiny_layout": ("random", "fixed"),  # grammar.LAYOUTS
    "policy.lora.init_lora_weights": ("gaussian", "zeros", "default"),
    "policy.diffusers.weighting_scheme": ("logit_normal", "mode", "uniform", "none", "sigma_sqrt",
                                          "cosmap"),
    "policy.diffusers.weight_copy_decay_type": (0, 1, 2),
    # unipc, dpm_solver: NFT's rollout only (Wan's and SANA's schedulers, on their own grids);
    # Flow-GRPO and DDRL check their own below
    "policy.diffusers.sample.solver": ("flow", "euler", "sde", "cps", "dance", "ddim", "dpm1", "dpm2",
                                       "edm", "unipc", "dpm_solver"),
    # jax.checkpoint_policies names, then the short aliases (models/layers/remat.py REMAT_ALIASES)
    "policy.remat": ("everything_saveable", "nothing_saveable", "dots_with_no_batch_dims_saveable",
                     "dots_saveable", "offload_dot_with_no_batch_dims", "attention_saveable",
                     "dots_with_no_batch_dims_and_attention_saveable",
                     "none", "full", "dots", "dots_no_batch", "offload"),
    "policy.attention_impl": ("auto", "xla", "cudnn", "blockwise", "pallas"),
    "policy.context_parallel_impl": ("auto", "ulysses", "ring"),
    "policy.vlm.vqa_target": ("fixed", "answer", "look"),
    "train.train_policy.lm_grpo.loss_type": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                             "token-sum"),  # algorithms/lm_grpo.py LOSS_TYPES
    "train.train_policy.lm_grpo.variant": ("grpo", "dapo"),  # algorithms/lm_grpo.py VARIANTS
    "policy.vlm.vqa_options": ("shuffled", "fixed"),
}

REWARD_FN_KEYS = ("name", "weight", "score_key", "clip_min", "clip_max")
RL_TYPES = ("nft", "grpo", "ddrl", "wfm_rl")


# (path key, build key): the tiny recipes build a random model / dataset at the path when absent
TINY_BUILDS = (("policy.model_name_or_path", "policy.build_tiny"),
               ("policy.model_name_or_path", "policy.build_tiny_pretrained"),
               ("train.train_policy.dataset.local_dir", "train.train_policy.dataset.build_tiny"))


def default_config() -> ml_collections.ConfigDict:
    """A fresh, locked config tree with every default."""
    config = ml_collections.ConfigDict(copy.deepcopy(DEFAULTS))
    config.lock()
    return config
