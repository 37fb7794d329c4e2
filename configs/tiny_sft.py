"""The embedded default for SFT: full fine-tune of a tiny random SD3 pipeline on 16 generated
32x32 images of coloured shapes; no download, a few minutes on 2 CPU cores, the loss falls.

    python -m wfm_jax.main --config configs/tiny_sft.py

The tiny pipeline (policy.model_name_or_path) and the shapes dataset
(train.train_policy.dataset.local_dir) are generated on first use and reused after.
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_sft"
    c.train.max_steps = 60
    c.train.seed = 0
    c.train.compute_dtype = "float32"
    c.train.optm_lr = 1e-3
    c.train.optm_warmup_steps = 5
    c.train.ema_enable = True
    c.train.ckpt.max_keep = 2
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_shapes"
    ds.build_tiny = True
    c.policy.model_name_or_path = "./outputs/tiny_sd3"
    c.policy.build_tiny = True
    d = c.policy.diffusers
    d.inference_size = (32, 32)
    d.max_prompt_length = 16
    return c
