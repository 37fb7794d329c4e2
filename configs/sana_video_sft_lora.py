"""LoRA fine-tune of SANA-Video 2B (480p) on your own videos: cosmos-rl's
configs/sana/sana-video-sft-lora.toml (r 4, alpha 4, gaussian init, on the linear self-attention
and cross-attention projections: config_schema.SANA_LORA_TARGETS). The export loads with
`SanaVideoPipeline.load_lora_weights(step_N/lora, weight_name="model.safetensors")`.

    python -m wfm_jax.main --config configs/sana_video_sft_lora.py \
        --config.train.train_policy.dataset.local_dir=/path/to/videos   # X.json + X.mp4

cosmos-rl's values as sana_video_sft.py (AdamW lr 1e-6, weight decay 0.01, eps 1e-6, 20 warmup
steps, global batch 8, 480x832, 300 tokens, checkpoints every 30 steps). The frozen base is
bf16; the LoRA weights, their AdamW moments and the EMA are fp32.
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import SANA_LORA_TARGETS


def get_config():
    c = compose("sana_video_sft.py")  # its optimizer, batch, checkpoints and validation sampler
    c.train.param_dtype = "bfloat16"  # the frozen base; LoRA weights and moments are fp32
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 4
    c.policy.lora.target_modules = SANA_LORA_TARGETS
    # data-parallel as sana_video_sft.py: the bf16 base (4 GB) is replicated on every device
    return c
