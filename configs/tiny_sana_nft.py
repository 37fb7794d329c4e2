"""DiffusionNFT on a tiny random SANA1.5 pipeline (python -m wfm_jax.tiny --family sana DIR):
32x32 images, no download, a few minutes on 2 CPU cores, with the local JPEG-compressibility
reward rising.

    python -m wfm_jax.main --config configs/tiny_sana_nft.py

The tiny SanaPipeline is built at policy.model_name_or_path on first use and reused after. As
sana_image_nft.py: rollouts with SANA's DPM-Solver++ (sample.solver "dpm_solver"), the default
complex human instruction in every prompt (rollout, update, validation), the Gemma mask on the
cross-attention; a full fine-tune at the random model's learning rate (a r 4 LoRA on a 2-layer
random model moves the reward too slowly to see in 20 steps; --config.policy.lora.enable=True
gives the recipe's adapters).
"""
import os

from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import SANA_LORA_TARGETS

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    c = compose("base/tiny_rl.py:sana", algorithm="nft")
    c.train.train_batch_per_replica = 16  # 4 prompts x 4 images
    c.train.train_policy.mini_batch = 8
    c.train.optm_lr = 3e-3  # the random tiny models' NFT value (tiny_wan_nft)
    c.train.train_policy.dataset.local_dir = os.path.join(HERE, "prompts", "tiny.txt")
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 4
    c.policy.lora.target_modules = SANA_LORA_TARGETS
    c.policy.diffusers.sample.solver = "dpm_solver"
    c.validation.batch_size = 4
    c.validation.dataset.holdout_fraction = 0.25
    return c
