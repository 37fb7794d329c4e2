"""What every Wan2.1-T2V-1.3B recipe shares (configs/wan21_1_3b_*.py start from it with
`compose("base/wan21_1_3b.py")`): the released checkpoint and WanPipeline's video shape.

    huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers \
        --local-dir Wan-AI/Wan2.1-T2V-1.3B-Diffusers
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.max_steps = 2000
    c.train.ema_enable = True  # every Wan recipe validates and exports the EMA weights
    c.policy.model_name_or_path = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # the local download
    c.policy.family = "wan"
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (480, 832)  # WanPipeline's default (H, W)
    d.train_frames = 81            # 4k + 1: 21 latent frames, WanPipeline's default
    d.inference_frames = 81
    d.max_prompt_length = 512      # WanPipeline's UMT5 max_sequence_length
    # 81 frames at 480p: each block rematerialised (spec §7: ~2.8 GiB of block inputs per clip
    # vs ~48 GiB without remat)
    c.policy.remat = "nothing_saveable"
    return c
