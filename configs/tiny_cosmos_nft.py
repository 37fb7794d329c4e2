"""DiffusionNFT on a tiny random Cosmos-Predict2.5 pipeline (text2world): 9-frame 32x32 videos,
no download, a few minutes on 2 CPU cores, with the local JPEG-compressibility reward (its
per-frame mean on video) rising. The shape of cosmos25_2b_nft.py (cosmos-rl's
cosmos-predict2-5-2b-720-nft.toml) at tiny sizes, full fine-tune.

    python -m wfm_jax.main --config configs/tiny_cosmos_nft.py

The tiny Cosmos2_5_PredictBasePipeline is built at policy.model_name_or_path on first use and
reused after (`python -m wfm_jax.tiny --family cosmos DIR`). Rollouts sample the flow ODE/SDE on
the family's schedule (Cosmos' Karras flow sigmas); the DiT sees sigma (wfm_jax passes the
family 1000 sigma, which it divides, in rollout and training alike).
"""
import os

from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import COSMOS_LORA_TARGETS

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    c = compose("base/tiny_rl.py:cosmos", algorithm="nft")
    c.train.train_batch_per_replica = 16  # 4 prompts x 4 videos
    c.train.train_policy.mini_batch = 2  # per device: 8 devices take the 16 rows at once
    c.train.optm_lr = 3e-3  # the random tiny models' NFT value (tiny_wan_nft)
    c.train.train_policy.dataset.local_dir = os.path.join(HERE, "prompts", "tiny.txt")
    # full fine-tune (a LoRA on a 2-layer random model moves the reward too slowly for 20
    # steps); --config.policy.lora.enable=True gives the 2B recipe's adapters
    c.policy.lora.enable = False
    c.policy.lora.r = 8
    c.policy.lora.lora_alpha = 16
    c.policy.lora.target_modules = COSMOS_LORA_TARGETS
    c.validation.batch_size = 4
    c.validation.dataset.holdout_fraction = 0.25
    return c
