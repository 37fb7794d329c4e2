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
from wfm_jax.config.schema import SANA_LORA_TARGETS, default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/sana_video_sft_lora"
    c.train.max_steps = 2000
    c.train.param_dtype = "bfloat16"  # the frozen base; LoRA weights and moments are fp32
    c.train.train_batch_per_replica = 8  # global: 1 per replica x dp_shard_size 8
    c.train.optm_lr = 1e-6
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-6
    c.train.optm_warmup_steps = 20
    c.train.ckpt.save_freq = 30
    c.train.ckpt.max_keep = 3
    c.policy.model_name_or_path = "Efficient-Large-Model/SANA-Video_2B_480p_diffusers"
    c.policy.family = "sana_video"
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 4
    c.policy.lora.target_modules = SANA_LORA_TARGETS
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (480, 832)
    # SanaVideoPipeline's default; 4k + 1 (the Wan VAE): 21 latent frames. Clips are cut to
    # train_frames and rollouts / validation sample inference_frames (cosmos-rl always sampled 81)
    d.train_frames = 81
    d.inference_frames = 81
    d.max_prompt_length = 300  # SanaVideoPipeline's max_sequence_length
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 4.5
    # the bf16 base (4 GB) fits on every device: replicated, the batch split over all of them
    c.policy.parallelism.data = -1
    c.policy.remat = "nothing_saveable"
    return c
