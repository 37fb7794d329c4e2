"""Video SFT on a tiny random Wan2.1 pipeline: full fine-tune on 16 generated 9-frame 32x32 clips
of coloured shapes drifting across the frame; no download, a few minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_wan_sft.py

The tiny WanPipeline (policy.model_name_or_path: `python -m wfm_jax.tiny --family wan DIR`) and
the clips (train.train_policy.dataset.local_dir: `python -m wfm_jax.data.tiny_dataset DIR
--frames 9`) are generated on first use and reused after. 9 frames encode to 3 latent frames of
4x4, 12 tokens after the (1, 2, 2) patching.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/tiny.py:wan")
    c.train.max_steps = 60
    c.train.optm_lr = 1e-3  # as tiny_sft: the random 2-layer model moves quickly
    c.train.optm_warmup_steps = 5
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_shapes_video"
    ds.build_tiny = True  # clips of train_frames frames, as the recipe is a video one
    d = c.policy.diffusers
    d.sample.eval_num_steps = 10
    d.sample.guidance_scale = 5.0  # WanPipeline's CFG
    return c
