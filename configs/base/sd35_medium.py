"""What every SD3.5-Medium recipe shares (configs/sd35_*.py start from it with
`compose("base/sd35_medium.py")`). The pipeline folder comes from the command line
(--config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium); 512x512 images and
the SD3 LoRA targets are the schema's defaults.
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.max_steps = 2000
    c.train.ema_enable = True  # every SD3.5 recipe validates and exports the EMA weights
    c.policy.family = "sd3"  # the schema's default, named so that the base says its model
    return c
