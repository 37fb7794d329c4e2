"""The embedded default for LoRA SFT: tiny random SD3 pipeline, generated shapes dataset,
LoRA r 4 / alpha 8 on the SD3 attention projections; a few minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_sft_lora.py
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_sft_lora"
    c.train.max_steps = 60
    c.train.seed = 0
    c.train.compute_dtype = "float32"
    c.train.optm_lr = 1e-2
    c.train.optm_warmup_steps = 5
    c.train.ema_enable = True
    c.train.ckpt.max_keep = 2
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_shapes"
    ds.build_tiny = True
    c.policy.model_name_or_path = "./outputs/tiny_sd3"
    c.policy.build_tiny = True
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 8
    d = c.policy.diffusers
    d.inference_size = (32, 32)
    d.max_prompt_length = 16
    return c
