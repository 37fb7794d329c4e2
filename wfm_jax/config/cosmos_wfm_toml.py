"""cosmos-rl's world-model (WFM) stack recipes -> a wfm_jax config tree.

The native Cosmos-Predict2.5 recipes (`[model]`, `[trainer]`, `[dataloader_train]`, ... :
spec cosmos_rl_wfm.md §2) run cosmos-rl's world-model RL step: the "GRPO" recipes (no
`[model.rl]`) and the DDRL ones share it. `read_wfm_recipe(tree, source)` returns
({wfm_jax dotted key: value}, [notes]). Every key of spec §2 is accepted; a key cosmos-rl does
not define is an error naming the nearest one, except the few cosmos-rl's own recipes carry
and cosmos-rl silently drops (listed in COSMOS_DROPS), which load with a note.

The step runs on the "wfm_rl" algorithm (wfm_jax.algorithms.wfm), which takes the [model.rl]
keys by their cosmos-rl names (train.train_policy.wfm); WFM_LOOP_KEYS lists the few the shared
RL loop owns.
"""
from __future__ import annotations

import difflib
import math
import os
from typing import Any

from wfm_jax.config.base import ConfigError

ANY = None  # a leaf (or an opaque subtree: the model's architecture, not a tunable)


def _leaves(names: str) -> dict[str, None]:
    return dict.fromkeys(names.split(), ANY)


_LOCAL_LOADER = _leaves("ratio dataset_dir batch_size num_workers pin_memory num_frames video_size "
    "offline_text_embedding text_encoder_type shuffle drop_last prefetch_factor")
_WEB_DATASET = _leaves("resolution len_t5 t5_dim num_video_frames caption_type embedding_type "
    "dataset_resolution_type video_decoder_name augmentor_name")
_WEB_LOADER = {"ratio": ANY, "dataloader": {
    **_leaves("use_cache cache_size concat_size cache_replay_name batch_size "
                        "num_workers pin_memory webdataset"),
    "cache_augment_fn": {"name": ANY, "args": ANY}, "dataset": _WEB_DATASET}}
_LOADER = {"type": ANY, "image_dataloader": {**_LOCAL_LOADER, **_WEB_LOADER},
           "video_dataloader": {**_LOCAL_LOADER, **_WEB_LOADER}}
RL_DEFAULTS: dict[str, Any] = {  # cosmos-rl RLConfig (spec §1 table): what the "GRPO" recipes run
    "sample_steps": 10, "train_on": list(range(8)), "num_rollout": 8, "kl_beta": 0.01,
    "data_beta": 0.0, "update_ref_every_iter": 16, "use_same_seed": True,
    "min_num_conditional_frames": 1, "max_num_conditional_frames": 1, "guidance": 0.0,
    "clip_ratio": 1e-4, "s_churn": 1.0, "s_noise": 1.0, "s_t_min": 0.0, "s_t_max": math.inf,
    "solver_option": "2ab", "on_policy": True, "exp_reward": False,
    "use_rl_sigma_and_noise": True, "data_on_first_only": False}
SCHEMA: dict[str, Any] = {
    "model": {
        "conditioner": ANY,  # [[model.conditioner]]: checked by _conditioners
        **_leaves("text_encoder_class fsdp_shard_size dp_replicate_size resolution "
                            "use_rf_ckpts loss_scale precision state_t sigma_conditional "
                            "sigma_data conditioning_strategy denoise_replace_gt_frames "
                            "min_num_conditional_frames max_num_conditional_frames"),
        "net": _leaves("model_channels num_blocks num_heads use_crossattn_projection "
            "crossattn_proj_in_channels crossattn_emb_channels max_img_h max_img_w max_frames "
            "in_channels out_channels patch_spatial patch_temporal concat_padding_mask "
            "pos_emb_cls use_adaln_lora adaln_lora_dim rope_h_extrapolation_ratio "
            "rope_w_extrapolation_ratio rope_t_extrapolation_ratio mlp_ratio "
            "use_wan_fp32_strategy rope_enable_fps_modulation"),
        "tokenizer": {"temporal_window": ANY, "chunk_duration": ANY},
        "text_encoder_config": _leaves("compute_online embedding_concat_strategy n_layers_per_group "
                                       "ckpt_path tokenizer_type encoder_model_config"),
        "rl": {**dict.fromkeys(RL_DEFAULTS, ANY), "reward_config": {
            "adv_clip_max": ANY, "adv_clip_min": ANY, "remote_reward": ANY, "fake_reward": ANY,
            "aesthetic": ANY, "image_reward": ANY}},
        "ema": {"enabled": ANY, "rate": ANY, "iteration_shift": ANY},
        "sde": {"p_mean": ANY, "p_std": ANY, "sigma_max": ANY, "sigma_min": ANY},
    },
    "model_parallel": _leaves("context_parallel_size tensor_model_parallel_size "
                                        "pipeline_model_parallel_size"),
    "trainer": _leaves("max_iter callbacks grad_scaler_args seed grad_accum_iter "
                                 "logging_iter run_validation validation_iter"),
    "optimizer": _leaves("lr weight_decay optim_type betas eps"),
    "scheduler": _leaves("f_start f_max f_min warm_up_steps cycle_lengths scheduler_type"),
    "dataloader_train": _LOADER,
    "dataloader_val": _LOADER,
    "job": _leaves("project group name wandb_mode timestamp"),
    "checkpoint": _leaves("load_path model_id type save_iter"),
}
# keys in cosmos-rl's own recipes that its pydantic config silently drops (spec §2)
COSMOS_DROPS = ("model_parallel.pipeline_parallel_size",)
CONDITIONERS = {"fps": "remap_key", "padding_mask": "remap_key", "text": "text_attr",
                "use_video_condition": "boolean_flag"}
CONDITIONER_KEYS = ("name", "type", "input_key", "output_key", "dropout_rate")
CALLBACKS = tuple(_leaves(
    "grad_clip low_prec every_n_sample_reg every_n_sample_ema wandb wandb_10x reward_callback "
    "frame_loss_log iter_speed param_count heart_beat device_monitor dataloader_speed manual_gc "
    "compile_tokenizer verify_data_batch_keys"))
# cosmos-rl VIDEO_RES_SIZE_INFO[resolution]["9,16"] as (H, W) (spec §3; the mock recipe's one)
RESOLUTIONS = {"480": (432, 768)}
WFM_MODULE = "cosmos_rl.tools.dataset.wfm_rl"
BUILTIN_REWARD = "jpeg_compressibility"
REMOTE_ENV = "REMOTE_REWARD_ENQUEUE_URL"

# cosmos-rl keys the shared RL loop owns (group size, conditional frames, the advantage clamp):
# cosmos-rl key -> the wfm_jax key it sets. Every other [model.rl] key, model.loss_scale and
# model.sde.{sigma_min,sigma_max,p_mean,p_std} go verbatim to train.train_policy.wfm.<name>,
# which the "wfm_rl" algorithm reads (docs/cosmos_rl_migration.md).
WFM_LOOP_KEYS = {
    "model.rl.num_rollout": "rollout.n_generation",
    "model.rl.min_num_conditional_frames": "policy.diffusers.min_num_conditional_frames",
    "model.rl.max_num_conditional_frames": "policy.diffusers.max_num_conditional_frames",
    "model.rl.reward_config.adv_clip_min": "train.train_policy.advantage_low",
    "model.rl.reward_config.adv_clip_max": "train.train_policy.advantage_high",
}
_LOOP_OWNED = ("num_rollout", "min_num_conditional_frames", "max_num_conditional_frames")


def is_wfm_recipe(tree: dict) -> bool:
    return "policy" not in tree and any(k in tree for k in ("model", "trainer", "dataloader_train"))


def _check_keys(node: Any, spec: Any, path: str, source: str, notes: list) -> None:
    if spec is ANY or not isinstance(node, dict):
        if isinstance(spec, dict) and not isinstance(node, dict):
            raise ConfigError(f"{source}: '{path}' is a section in cosmos-rl, not a value")
        return
    for key, value in node.items():
        full = f"{path}.{key}" if path else key
        if full in COSMOS_DROPS:
            notes.append(f"'{full}' is not a cosmos-rl key (cosmos-rl drops it silently); ignored")
            continue
        if key not in spec:
            close = difflib.get_close_matches(key, sorted(spec), n=1, cutoff=0.6)
            hint = (f"; did you mean '{close[0]}'?" if close
                    else f"; valid keys there: {', '.join(sorted(spec))}")
            raise ConfigError(f"{source}: unknown cosmos-rl key '{full}'{hint}")
        _check_keys(value, spec[key], full, source, notes)


def _conditioners(entries: Any, source: str) -> float:
    """Check [[model.conditioner]]; returns the text embedder's dropout_rate."""
    where = "model.conditioner"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: '{where}' must be [[{where}]] tables")
    dropout = 0.0
    for i, entry in enumerate(entries):
        for key in entry:
            if key not in CONDITIONER_KEYS:
                close = difflib.get_close_matches(key, CONDITIONER_KEYS, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; valid: {list(CONDITIONER_KEYS)}"
                raise ConfigError(f"{source}: unknown cosmos-rl key '{where}[{i}].{key}'{hint}")
        name = entry.get("name")
        if name not in CONDITIONERS:
            raise ConfigError(f"{source}: '{where}[{i}].name' = {name!r} is not one of cosmos-rl's "
                              f"video conditioners {sorted(CONDITIONERS)}")
        if entry.get("type", "remap_key") != CONDITIONERS[name]:
            raise ConfigError(f"{source}: '{where}[{i}]' ({name}) has type {entry.get('type')!r}; "
                              f"cosmos-rl's is {CONDITIONERS[name]!r}")
        if name == "text":
            dropout = float(entry.get("dropout_rate", 0.0))
    return dropout


def _callbacks(entries: Any, source: str, notes: list) -> dict[str, dict]:
    """[[trainer.callbacks]] -> {name: args}."""
    where = "trainer.callbacks"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{source}: '{where}' must be [[{where}]] tables")
    out = {}
    for i, entry in enumerate(entries):
        name = entry.get("name")
        if name not in CALLBACKS:
            close = difflib.get_close_matches(str(name), CALLBACKS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"{source}: '{where}[{i}].name' = {name!r} is not a cosmos-rl "
                              f"callback{hint}")
        stray = sorted(set(entry) - {"name", "args"})
        if stray:  # cosmos-rl passes only `args` on: a key beside it never applied there
            notes.append(f"'{where}[{i}]' ({name}): {', '.join(stray)} outside 'args' is "
                         f"dropped by cosmos-rl; ignored")
        out[name] = dict(entry.get("args") or {})
    return out


def _video_loader(tree: dict, section: str) -> tuple[str, dict]:
    loader = tree.get(section) or {}
    return str(loader.get("type", "web")), dict(loader.get("video_dataloader") or {})


def _size_hw(video_size: Any, source: str, where: str) -> tuple[int, int]:
    if not (isinstance(video_size, list) and len(video_size) == 2):
        raise ConfigError(f"{source}: '{where}' must be [W, H], got {video_size!r}")
    width, height = (int(v) for v in video_size)
    return height, width


def _one(values: Any, default: float, key: str, source: str) -> float:
    """cosmos-rl's scheduler lists hold one entry per cycle; its recipes use one cycle."""
    if values is None:
        return default
    if not isinstance(values, list) or len(values) != 1:
        raise ConfigError(f"{source}: 'scheduler.{key}' = {values!r}: wfm_jax runs one cycle "
                          f"(a one-entry list)")
    return float(values[0])


def read_wfm_recipe(tree: dict, source: str) -> tuple[dict[str, Any], list[str]]:
    """A parsed cosmos-rl WFM-stack recipe -> ({wfm_jax dotted key: value}, [notes])."""
    notes: list[str] = []
    _check_keys(tree, SCHEMA, "", source, notes)
    model, rl = tree.get("model", {}), dict(RL_DEFAULTS)
    rl.update({k: v for k, v in model.get("rl", {}).items() if k != "reward_config"})
    reward_cfg = model.get("rl", {}).get("reward_config", {})
    dropout = _conditioners(model.get("conditioner", []), source)
    trainer = tree.get("trainer", {})
    callbacks = _callbacks(trainer.get("callbacks", []), source, notes)
    out: dict[str, Any] = {"policy.family": "cosmos", "policy.diffusers.is_video": True,
                           "train.train_policy.type": "wfm_rl", "train.compute_dtype": "bfloat16",
                           "train.param_dtype": "float32"}
    # -- the RL step (spec §1): the wfm_rl algorithm takes cosmos-rl's keys as they are --
    if rl["solver_option"] != "2ab":
        notes.append(f"model.rl.solver_option = {rl['solver_option']!r}: cosmos-rl rolls out with "
                     f"2ab whatever it says; wfm_jax rolls out and trains with "
                     f"{rl['solver_option']!r}")
    if not rl["on_policy"]:
        raise ConfigError(f"{source}: model.rl.on_policy = false: wfm_jax's world-model RL step is "
                          f"on-policy only")
    wfm = "train.train_policy.wfm."
    out.update({wfm + k: type(RL_DEFAULTS[k])(v) for k, v in rl.items()
                if k not in _LOOP_OWNED and k != "train_on"})
    out[wfm + "train_on"] = tuple(int(i) for i in rl["train_on"])
    sde = model.get("sde", {})
    out.update({wfm + "loss_scale": float(model.get("loss_scale", 10.0)),
                wfm + "sigma_min": float(sde.get("sigma_min", 0.01)),
                wfm + "sigma_max": float(sde.get("sigma_max", 200.0)),
                wfm + "p_mean": float(sde.get("p_mean", math.log(4.0))),
                wfm + "p_std": float(sde.get("p_std", 1.2))})
    out.update({
        "rollout.n_generation": int(rl["num_rollout"]),
        "policy.diffusers.min_num_conditional_frames": int(rl["min_num_conditional_frames"]),
        "policy.diffusers.max_num_conditional_frames": int(rl["max_num_conditional_frames"]),
        "train.train_policy.advantage_low": float(reward_cfg.get("adv_clip_min", -5.0)),
        "train.train_policy.advantage_high": float(reward_cfg.get("adv_clip_max", 5.0)),
        "train.train_policy.mu_iterations": 1,
        # validation samples with the family's sampler; cosmos x0 = c + g (c - u) is standard
        # CFG at scale g + 1
        "policy.diffusers.sample.guidance_scale": float(rl["guidance"]) + 1.0,
    })
    out[wfm + "text_dropout_rate"] = dropout  # the data loss's conditioning (spec §5)
    if model.get("use_rf_ckpts"):
        notes.append("model.use_rf_ckpts: conditioned frames get the Cosmos pipeline's "
                     "conditional timestep, not the noisy frames' one")
    # -- parallelism and batch: one video per data-parallel rank (spec §1) --
    shard, replicate = int(model.get("fsdp_shard_size", 8)), int(model.get("dp_replicate_size", 1))
    mp = tree.get("model_parallel", {})
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        if int(mp.get(key, 1)) != 1:
            raise ConfigError(f"{source}: model_parallel.{key} = {mp[key]}: cosmos-rl's WFM stack "
                              f"and wfm_jax use 1 (fsdp + context parallel only)")
    train_type, video = _video_loader(tree, "dataloader_train")
    per_rank = int(video.get("batch_size", (video.get("dataloader") or {}).get("batch_size", 1)))
    out.update({"policy.parallelism.fsdp": shard, "policy.parallelism.data": replicate,
                "policy.parallelism.context": int(mp.get("context_parallel_size", 1)),
                "train.train_batch_per_replica": shard * replicate * per_rank,
                "train.train_policy.mini_batch": per_rank})
    # -- optimiser, schedule, EMA (spec §6) --
    opt, sched = tree.get("optimizer", {}), tree.get("scheduler", {})
    if str(opt.get("optim_type", "fusedadam")).lower() not in ("fusedadam", "adamw", "adam"):
        raise ConfigError(f"{source}: optimizer.optim_type = {opt['optim_type']!r}: wfm_jax trains "
                          f"with AdamW (cosmos-rl's fusedadam in adam_w_mode)")
    f_min = _one(sched.get("f_min"), 1.0, "f_min", source)
    f_max = _one(sched.get("f_max"), 1.0, "f_max", source)
    warmup = int(_one(sched.get("warm_up_steps"), 1000, "warm_up_steps", source))
    if f_min != 1.0 or f_max != 1.0:
        raise ConfigError(f"{source}: scheduler f_min = {f_min}, f_max = {f_max}: wfm_jax runs "
                          f"cosmos-rl's lambda_linear only as its recipes set it (f_min = f_max = 1: "
                          f"warm-up, then constant)")
    out.update({"train.optm_lr": float(opt.get("lr", 1e-5)),
                "train.optm_weight_decay": float(opt.get("weight_decay", 1e-4)),
                "train.optm_betas": tuple(float(b) for b in opt.get("betas", (0.9, 0.99))),
                "train.optm_eps": float(opt.get("eps", 1e-8)),
                "train.lr_schedule": "constant",
                "train.optm_warmup_steps": warmup,
                "train.ema_enable": bool(model.get("ema", {}).get("enabled", True))})
    clip = callbacks.get("grad_clip")
    out["train.optm_grad_norm_clip"] = float(clip.get("clip_norm", 1.0)) if clip is not None else 0.0
    # -- trainer, logging, checkpoints --
    if int(trainer.get("grad_accum_iter", 1)) != 1:
        raise ConfigError(f"{source}: trainer.grad_accum_iter = {trainer['grad_accum_iter']}: "
                          f"wfm_jax's world-model step accumulates over train_on only (1)")
    job = tree.get("job", {})
    project = str(job.get("project", "cosmos_wfm_v2"))
    group = str(job.get("group", "official_runs_vid2vid_debug"))
    name = str(job.get("name") or "wfm")
    # no timestamp dir (spec §10): a relaunch finds its checkpoints
    root = os.environ.get("COSMOS_OUTPUT_DIR", "./outputs")
    ckpt = tree.get("checkpoint", {})
    out.update({"train.max_steps": int(trainer.get("max_iter", 25)),
                "train.seed": int(trainer.get("seed", 0)),
                "train.log_freq": 1,
                "train.output_dir": os.path.join(root, project, group, name),
                "train.wandb.enable": "wandb" in callbacks,
                "train.wandb.project": project, "train.wandb.name": name,
                "train.wandb.mode": str(job.get("wandb_mode", "online")),
                "train.ckpt.save_freq": int(ckpt.get("save_iter", 1000))})
    load_path, model_id = str(ckpt.get("load_path", "") or ""), str(ckpt.get("model_id") or "")
    # -- data, text, rewards, validation --
    if train_type == "web":
        _mock(tree, video, out, source)
    elif train_type == "local":
        _local(tree, video, out, source, callbacks)
    else:
        raise ConfigError(f"{source}: dataloader_train.type = {train_type!r} is not 'local' or 'web'")
    mock = out["train.train_policy.dataset.layout"] == "mock"
    if warmup >= out["train.max_steps"]:  # spec §10: kept (it is what the recipe ran), but said
        notes.append(f"the {warmup}-step LR warm-up does not end within max_iter "
                     f"{out['train.max_steps']} (as in cosmos-rl); --config.train.optm_warmup_steps=N "
                     f"to change it")
    if load_path:
        out["policy.model_name_or_path"] = f"{load_path}/{model_id}" if model_id else load_path
    else:  # random init (cosmos-rl's mock mode): the released pipeline gives the VAE and shapes
        out["policy.model_name_or_path"] = "nvidia/Cosmos-Predict2.5-2B"
    _rewards(out, mock, notes)
    return out, notes


def _mock(tree: dict, video: dict, out: dict, source: str) -> None:
    """Mock-data mode (spec §3): a web loader whose dataset sets len_t5."""
    dataset = (video.get("dataloader") or {}).get("dataset") or {}
    if "len_t5" not in dataset:
        raise ConfigError(f"{source}: dataloader_train.type = 'web' reads cosmos-rl's internal "
                          f"webdataset, which is not here; only its mock-data mode (dataset.len_t5 "
                          f"set) runs. Use type = 'local' with dataset_dir for your data")
    resolution = str(dataset.get("resolution", "480"))
    if resolution not in RESOLUTIONS:
        raise ConfigError(f"{source}: mock dataset resolution {resolution!r}: wfm_jax knows "
                          f"{sorted(RESOLUTIONS)}")
    frames = int(dataset.get("num_video_frames", 93))
    out.update({"train.train_policy.dataset.layout": "mock",
                "train.train_policy.dataset.local_dir": "",
                "train.train_policy.dataset.mock_text_dim": int(dataset.get("t5_dim", 1024)),
                "policy.diffusers.max_prompt_length": int(dataset["len_t5"]),
                "policy.diffusers.inference_size": RESOLUTIONS[resolution],
                "policy.diffusers.train_frames": frames,
                "policy.diffusers.inference_frames": frames,
                # cosmos-rl samples a visualisation on the RL batch; mock mode has no held-out data
                "validation.enable": False})


def _local(tree: dict, video: dict, out: dict, source: str, callbacks: dict) -> None:
    """cosmos-rl's local loader: <dataset_dir>/videos/*.mp4 + metas/*.txt (the WFM layout)."""
    if "dataset_dir" not in video:
        raise ConfigError(f"{source}: dataloader_train.video_dataloader.dataset_dir is missing")
    frames = int(video.get("num_frames", 93))
    size = _size_hw(video.get("video_size", [1280, 720]), source,
                    "dataloader_train.video_dataloader.video_size")
    out.update({"train.train_policy.dataset.layout": "wfm",
                "train.train_policy.dataset.local_dir": str(video["dataset_dir"]),
                "policy.diffusers.max_prompt_length": 512,
                # [W, H] as its recipes mean it (cosmos-rl's torchvision resize reads (H, W): §10)
                "policy.diffusers.inference_size": size,
                "policy.diffusers.train_frames": frames,
                "policy.diffusers.inference_frames": frames})
    val_type, val = _video_loader(tree, "dataloader_val")
    sample = callbacks.get("every_n_sample_reg") or callbacks.get("every_n_sample_ema")
    if val_type == "local" and val.get("dataset_dir") and sample is not None:
        out.update({"validation.enable": True,
                    "validation.dataset.local_dir": str(val["dataset_dir"]),
                    "validation.freq": int(sample.get("every_n", 100)),
                    "validation.batch_size": int(out["rollout.n_generation"]),
                    "policy.diffusers.sample.eval_num_steps": int(sample.get("num_sampling_step", 35))})


def _rewards(out: dict, mock: bool, notes: list) -> None:
    """cosmos-rl's remote reward (dance_grpo, overall_reward, latents, clamp 5); in mock mode
    without a reward service, a built-in deterministic reward instead (spec §3)."""
    if mock and not os.environ.get(REMOTE_ENV):
        out.update({"train.train_policy.use_remote_reward": False,
                    "train.train_policy.remote_reward.media_type": "pixels",
                    "train.train_policy.remote_reward.reward_fns": [
                        {"name": BUILTIN_REWARD, "weight": 1.0, "score_key": ""}]})
        notes.append(f"mock data and no reward service ({REMOTE_ENV} unset): rewarding with the "
                     f"built-in deterministic {BUILTIN_REWARD} reward")
        return
    out.update({"train.train_policy.use_remote_reward": True,
                "train.train_policy.remote_reward.media_type": "latent",
                "train.train_policy.remote_reward.clip": 5.0,
                "train.train_policy.std_ddof": 1, "train.train_policy.global_std": False,
                "train.train_policy.remote_reward.reward_fns": [
                    {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]})
