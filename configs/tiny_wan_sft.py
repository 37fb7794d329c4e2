"""Video SFT on a tiny random Wan2.1 pipeline: full fine-tune on 16 generated 9-frame 32x32 clips
of coloured shapes drifting across the frame; no download, a few minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_wan_sft.py

The tiny WanPipeline (policy.model_name_or_path: `python -m wfm_jax.tiny --family wan DIR`) and
the clips (train.train_policy.dataset.local_dir: `python -m wfm_jax.data.tiny_dataset DIR
--frames 9`) are generated on first use and reused after. 9 frames encode to 3 latent frames of
4x4, 12 tokens after the (1, 2, 2) patching.
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_wan_sft"
    c.train.max_steps = 60
    c.train.seed = 0
    c.train.compute_dtype = "float32"
    c.train.optm_lr = 1e-3  # as tiny_sft: the random 2-layer model moves quickly
    c.train.optm_warmup_steps = 5
    c.train.ema_enable = True
    c.train.ckpt.max_keep = 2
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_shapes_video"
    ds.build_tiny = True  # clips of train_frames frames, as the recipe is a video one
    c.policy.model_name_or_path = "./outputs/tiny_wan"
    c.policy.family = "wan"
    c.policy.build_tiny = True
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (32, 32)
    d.train_frames = 9       # 4k + 1, the tiny VAE's x4 time compression: 3 latent frames
    d.inference_frames = 9
    d.max_prompt_length = 16
    d.sample.eval_num_steps = 10
    d.sample.guidance_scale = 5.0  # WanPipeline's CFG
    return c
