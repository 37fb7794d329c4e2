"""What every tiny recipe shares (configs/tiny_*.py start from it, the RL ones through
configs/base/tiny_rl.py): a tiny random twin of a family's pipeline, built on first use at
./outputs/tiny_<family> (`python -m wfm_jax.tiny --family FAMILY DIR`), run in fp32 on a few CPU
cores. `compose("base/tiny.py:wan")` picks the family (default sd3).
"""
from wfm_jax.config.schema import default_config

VIDEO_FAMILIES = ("wan", "cosmos", "sana_video")  # their twins make 9-frame clips


def get_config(family="sd3"):
    c = default_config()
    c.train.seed = 0
    c.train.compute_dtype = "float32"  # CPU runs: no bf16 matmuls to gain from
    c.train.ema_enable = True
    c.train.ckpt.max_keep = 2
    c.policy.model_name_or_path = f"./outputs/tiny_{family}"
    c.policy.family = family  # (sd3: the schema's default)
    c.policy.build_tiny = True
    d = c.policy.diffusers
    d.inference_size = (32, 32)  # the smallest size SANA takes (multiples of 32)
    d.max_prompt_length = 16
    if family in VIDEO_FAMILIES:
        d.is_video = True
        d.train_frames = 9  # 4k + 1, the tiny VAE's x4 time compression: 3 latent frames
        d.inference_frames = 9
    return c
