"""The embedded default for SFT: full fine-tune of a tiny random SD3 pipeline on 16 generated
32x32 images of coloured shapes; no download, a few minutes on 2 CPU cores, the loss falls.

    python -m wfm_jax.main --config configs/tiny_sft.py

The tiny pipeline (policy.model_name_or_path) and the shapes dataset
(train.train_policy.dataset.local_dir) are generated on first use and reused after.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/tiny.py")
    c.train.max_steps = 60
    c.train.optm_lr = 1e-3
    c.train.optm_warmup_steps = 5
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_shapes"
    ds.build_tiny = True
    return c
