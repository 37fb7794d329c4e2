"""DiffusionNFT on a tiny random Wan2.1 pipeline: 9-frame 32x32 videos, no download, a few
minutes on 2 CPU cores, with the local JPEG-compressibility reward (its per-frame mean on video)
rising.

    python -m wfm_jax.main --config configs/tiny_wan_nft.py

The tiny WanPipeline is built at policy.model_name_or_path on first use and reused after
(`python -m wfm_jax.tiny --family wan DIR`). To score the videos with the reference reward
server instead (videos sent as uint8 [B, C, T, H, W], media_type "video"):
--config.train.train_policy.use_remote_reward=True and the server's URLs
(train.train_policy.remote_reward.* or REMOTE_REWARD_ENQUEUE_URL / _FETCH_URL).
"""
import os

from wfm_jax.config.recipe import compose

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    c = compose("base/tiny_rl.py:wan", algorithm="nft")
    c.train.train_batch_per_replica = 16  # 4 prompts x 4 videos
    # rows per device per micro-batch: 2 x 8 devices is the whole batch of 16, so the recipe
    # runs on 1, 2, 4 or 8 devices (8 micro-batches on one)
    c.train.train_policy.mini_batch = 2
    c.train.optm_lr = 3e-3  # the random tiny SD3 NFT's value (tiny_nft before the shapes world)
    c.train.train_policy.dataset.local_dir = os.path.join(HERE, "prompts", "tiny.txt")
    # Full fine-tune, as the tiny SD3 NFT: a LoRA on a 2-layer random model moves the reward too
    # slowly to see in 20 steps; --config.policy.lora.enable=True gives the recipe's adapters.
    c.policy.lora.enable = False
    c.policy.lora.r = 8
    c.policy.lora.lora_alpha = 16
    c.validation.batch_size = 4
    c.validation.dataset.holdout_fraction = 0.25
    return c
