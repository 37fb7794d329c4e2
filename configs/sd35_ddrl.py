"""DDRL post-training of SD3.5-Medium with cosmos-rl's DDRL hyper-parameters (spec §4).

    python -m wfm_jax.main --config configs/sd35_ddrl.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/paired_images

The dataset is the SFT paired layout (X.json with "prompt" + X.jpg|png): each batch takes 8 data
items, rolls each out 8 times from its caption (EDM sampler, 20 steps, churn 1, no CFG), and the
images regularise the policy through the diffusion loss (data_beta). Full fine-tune, as cosmos-rl.
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/sd35_ddrl"
    c.train.train_policy.type = "ddrl"
    c.train.max_steps = 2001
    c.train.param_dtype = "float32"  # fp32 master weights, bf16 compute
    c.train.compute_dtype = "bfloat16"
    c.train.train_batch_per_replica = 64  # 8 data items x 8 rollouts
    c.train.train_policy.mini_batch = 1
    c.train.optm_lr = 1e-5
    c.train.optm_weight_decay = 1e-4
    c.train.optm_betas = (0.9, 0.99)
    c.train.optm_warmup_steps = 50
    c.train.optm_grad_norm_clip = 1.0
    c.train.ema_enable = True
    c.train.ema_decay = 0.9
    c.train.ckpt.save_freq = 100
    tp = c.train.train_policy
    tp.dataset.layout = "paired"
    tp.train_on = tuple(range(0, 20, 2))
    tp.clip_range = 1e-4
    tp.kl_beta = 0.0
    tp.data_beta = 0.01
    tp.loss_scale = 10.0
    tp.exp_reward = False  # cosmos-rl's default and its released DDRL recipes
    tp.use_rl_sigma_and_noise = True
    tp.data_on_first_only = False
    tp.update_ref_every_iter = 0
    tp.advantage_low = -5.0
    tp.advantage_high = 5.0
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [{"name": "pickscore", "weight": 1.0, "score_key": ""}]
    c.rollout.n_generation = 8  # num_rollout
    c.policy.lora.enable = False
    d = c.policy.diffusers
    d.inference_size = (512, 512)
    d.max_prompt_length = 128
    s = d.sample
    s.solver = "edm"
    s.num_steps = 20
    s.eval_num_steps = 40
    s.guidance_scale = 1.0
    s.s_churn = 1.0
    s.s_noise = 1.0
    s.edm_sigma_min = 0.01
    s.edm_sigma_max = 200.0
    s.edm_rho = 7.0
    s.deterministic_sampling = False
    # full fine-tune: weights, moments, EMA and the reference copy sharded over every device
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.validation.enable = True
    c.validation.freq = 100
    c.validation.batch_size = 16
    c.validation.dataset.holdout_fraction = 0.01
    return c
