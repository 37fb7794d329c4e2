"""DiffusionNFT post-training of SD3.5-Medium: the values of cosmos-rl's SD3.5-Medium NFT recipe.

    python -m wfm_jax.main --config configs/sd35_nft.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/pickscore

The reward comes from a running reward service (REMOTE_REWARD_ENQUEUE_URL / _FETCH_URL /
_TOKEN, or train.train_policy.remote_reward.*), PickScore by default.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sd35_medium.py", algorithm="nft")
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 1152  # 48 prompts x 24 images
    c.train.train_policy.mini_batch = 9
    # cosmos-rl's remote-reward advantages: per-prompt mean and per-prompt unbiased std.
    # NVlabs DiffusionNFT (the paper's numbers) divides by the whole batch's population std:
    # --config.train.train_policy.global_std=True --config.train.train_policy.std_ddof=0
    c.train.train_policy.global_std = False
    c.train.train_policy.std_ddof = 1
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "pickscore", "weight": 1.0, "score_key": ""}]
    c.policy.lora.enable = True
    # blocks unrolled: by the TPU cost model on v5p:2x2x1 (--layers 2), update 115 s at 54 GB a
    # chip against 156 s at 95 GB scanned; est. MFU update 45.5%, rollout 46.8% (docs/tpu_tuning.md)
    c.policy.scan_layers = False
    # the norms' own checkpoints off: on v5p:2x2x1 they cost this update both memory and time
    # (53.16 against 50.49 GB a chip, 103.3 against 102.0 s; docs/recipe_targets.md, session 50)
    c.policy.norm_checkpoints = False
    c.validation.enable = True
    c.validation.batch_size = 16
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
