"""LoRA fine-tune of SD3.5-Medium on your own images: r 32 / alpha 64 gaussian LoRA on the
attention projections (cosmos-rl's SD3 targets); the export loads with
`pipe.load_lora_weights(step_N/lora, weight_name="model.safetensors", adapter_name="default")`.

    python -m wfm_jax.main --config configs/sd35_sft_lora.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/images   # X.json + X.jpg|png

The frozen base weights are bf16; LoRA weights, their AdamW moments and the EMA are fp32.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("sd35_sft.py")  # its batch and checkpoints
    c.train.param_dtype = "bfloat16"
    c.train.optm_lr = 1e-4
    c.train.optm_warmup_steps = 50
    c.train.ema_decay = 0.99
    c.policy.lora.enable = True
    # the bf16 base is replicated, the batch split over every device; no remat (sd35_sft's)
    c.policy.parallelism.data = -1
    c.policy.parallelism.fsdp = 1
    c.policy.scan_layers = True  # sd35_sft unrolls its blocks; measured for the full fine-tune only
    return c
