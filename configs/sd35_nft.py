"""DiffusionNFT post-training of SD3.5-Medium: the values of cosmos-rl's SD3.5-Medium NFT recipe.

    python -m wfm_jax.main --config configs/sd35_nft.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/pickscore

The reward comes from a running reward service (REMOTE_REWARD_ENQUEUE_URL / _FETCH_URL /
_TOKEN, or train.train_policy.remote_reward.*), PickScore by default.
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/sd35_nft"
    c.train.train_policy.type = "nft"
    c.train.max_steps = 2000
    c.train.param_dtype = "bfloat16"
    c.train.compute_dtype = "bfloat16"
    c.train.train_batch_per_replica = 1152  # 48 prompts x 24 images
    c.train.train_policy.mini_batch = 9
    c.train.optm_lr = 3e-4
    c.train.optm_weight_decay = 1e-4
    c.train.optm_betas = (0.9, 0.999)
    c.train.optm_grad_norm_clip = 1.0
    c.train.ema_enable = True
    c.train.ema_decay = 0.9
    c.train.ema_update_step_interval = 1
    c.train.ckpt.save_freq = 20
    c.train.train_policy.kl_beta = 1e-4
    c.train.train_policy.timesteps_fraction = 0.99
    c.train.train_policy.advantage_low = -5.0
    c.train.train_policy.advantage_high = 5.0
    # cosmos-rl's remote-reward advantages: per-prompt mean and per-prompt unbiased std.
    # NVlabs DiffusionNFT (the paper's numbers) divides by the whole batch's population std:
    # --config.train.train_policy.global_std=True --config.train.train_policy.std_ddof=0
    c.train.train_policy.global_std = False
    c.train.train_policy.std_ddof = 1
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "pickscore", "weight": 1.0, "score_key": ""}]
    c.rollout.n_generation = 24
    c.policy.lora.enable = True
    c.policy.lora.r = 32
    c.policy.lora.lora_alpha = 64
    c.policy.lora.init_lora_weights = "gaussian"
    d = c.policy.diffusers
    d.inference_size = (512, 512)
    d.max_prompt_length = 128
    d.nft_beta = 1.0
    d.weight_copy_decay_type = 1
    d.sample.num_steps = 10
    d.sample.eval_num_steps = 40
    d.sample.guidance_scale = 1.0
    d.sample.solver = "dpm2"
    d.sample.deterministic_sampling = True
    c.validation.enable = True
    c.validation.freq = 20
    c.validation.batch_size = 16
    return c
