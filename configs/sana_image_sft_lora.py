"""LoRA fine-tune of SANA1.5 1.6B on your own images: cosmos-rl's
configs/sana/sana-image-sft-lora.toml (r 4, alpha 4, gaussian init, on the linear self-attention
and cross-attention projections: config_schema.SANA_LORA_TARGETS). The export loads with
`SanaPipeline.load_lora_weights(step_N/lora, weight_name="model.safetensors")`.

    python -m wfm_jax.main --config configs/sana_image_sft_lora.py \
        --config.train.train_policy.dataset.local_dir=/path/to/images   # X.json + X.jpg|png

cosmos-rl's values as sana_image_sft.py (AdamW lr 1e-4, weight decay 0.01, eps 1e-5, global
batch 8, logit-normal timesteps, 1024x1024, 300 tokens, validation at guidance 4.5 / 50 steps),
checkpoints every 10 steps. The frozen base is bf16; the LoRA weights, their AdamW moments and
the EMA are fp32. Instruction and text mask as in training, rollout and validation alike.
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import SANA_LORA_TARGETS


def get_config():
    c = compose("sana_image_sft.py")  # its optimizer, batch and validation sampler
    c.train.param_dtype = "bfloat16"  # the frozen base; LoRA weights and moments are fp32
    c.train.ckpt.save_freq = 10
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 4
    c.policy.lora.target_modules = SANA_LORA_TARGETS
    # data-parallel as sana_image_sft.py: the bf16 base (3.2 GB) is replicated on every device
    return c
