"""The embedded default for LoRA SFT: tiny random SD3 pipeline, generated shapes dataset,
LoRA r 4 / alpha 8 on the SD3 attention projections; a few minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_sft_lora.py
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("tiny_sft.py")
    c.train.optm_lr = 1e-2
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 8
    return c
