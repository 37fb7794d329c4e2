"""DiffusionNFT on a tiny random SANA-Video pipeline (python -m wfm_jax.tiny --family
sana_video DIR): 9-frame 32x32 videos, no download, a few minutes on 2 CPU cores, with the local
JPEG-compressibility reward (its per-frame mean on video). On 32x32 clips that reward barely moves
(-0.00257 -> -0.00247 in 20 steps); tests/train/test_sana_train.py swaps in a mean-brightness reward,
which this recipe raises by more than 3 standard errors in 14 steps (2 seeds checked).

    python -m wfm_jax.main --config configs/tiny_sana_video_nft.py

The tiny SanaVideoPipeline is built at policy.model_name_or_path on first use and reused after.
It is tiny_sana_nft.py with videos (only the keys set here differ). As sana_video_nft.py:
rollouts with SANA's DPM-Solver++ (sample.solver "dpm_solver"), the default complex human
instruction in every prompt (rollout, update, validation), the Gemma mask on the
cross-attention; a full fine-tune at the random model's learning rate (a r 4 LoRA on a 2-layer
random model moves the reward too slowly to see in 20 steps; --config.policy.lora.enable=True
gives the recipe's adapters).
"""
import os

from wfm_jax.config.recipe import base_recipe

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
    c = base_recipe(os.path.join(HERE, "tiny_sana_nft.py"))
    c.train.output_dir = "./outputs/tiny_sana_video_nft"
    c.train.train_batch_per_replica = 16  # 4 prompts x 4 videos
    c.policy.model_name_or_path = "./outputs/tiny_sana_video"
    c.policy.family = "sana_video"
    d = c.policy.diffusers
    d.is_video = True
    # 4k + 1 (the tiny Wan VAE's x4 time compression): 3 latent frames; rollouts sample these
    d.train_frames = 9
    d.inference_frames = 9
    return c
