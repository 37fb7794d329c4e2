"""LoRA fine-tune of Wan2.1-T2V-1.3B on your own videos: r 32 / alpha 64 gaussian LoRA on the
self- and cross-attention projections and the FFN (spec video_models.md §5.5), 81 frames at
480x832; the export loads with `WanPipeline.load_lora_weights(step_N/lora,
weight_name="model.safetensors")`.

    huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers \
        --local-dir Wan-AI/Wan2.1-T2V-1.3B-Diffusers
    python -m wfm_jax.main --config configs/wan21_1_3b_sft_lora.py \
        --config.train.train_policy.dataset.local_dir=/path/to/videos   # X.json + X.mp4

The frozen base weights are bf16; LoRA weights, their AdamW moments and the EMA are fp32.
"""
from wfm_jax.config.schema import WAN_LORA_TARGETS, default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/wan21_1_3b_sft_lora"
    c.train.max_steps = 2000
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 8  # global batch: one clip per device on 8 GPUs
    c.train.optm_lr = 1e-4               # as sd35_sft_lora
    c.train.optm_warmup_steps = 50
    c.train.ema_enable = True
    c.train.ema_decay = 0.99
    c.train.ckpt.save_freq = 200
    c.train.ckpt.max_keep = 3
    c.policy.model_name_or_path = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    c.policy.family = "wan"
    # r / alpha / init as cosmos-rl's Cosmos-Predict2.5 NFT LoRA (cosmos-predict2-5-2b-720-nft.toml)
    c.policy.lora.enable = True
    c.policy.lora.target_modules = WAN_LORA_TARGETS
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (480, 832)
    d.train_frames = 81
    d.inference_frames = 81
    d.max_prompt_length = 512
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 5.0
    # the bf16 base (2.8 GB) is replicated, the batch split over devices; blocks rematerialised
    c.policy.parallelism.data = -1
    c.policy.remat = "nothing_saveable"
    return c
