"""Full fine-tune of SANA-Video 2B (480p) on your own videos (rectified-flow SFT): cosmos-rl's
configs/sana/sana-video-sft.toml.

    huggingface-cli download Efficient-Large-Model/SANA-Video_2B_480p_diffusers \
        --local-dir Efficient-Large-Model/SANA-Video_2B_480p_diffusers
    python -m wfm_jax.main --config configs/sana_video_sft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/videos   # X.json + X.mp4

cosmos-rl's values: AdamW lr 1e-6, weight decay 0.01, eps 1e-6, 20 warmup steps, clip 1.0; one
clip per replica on dp_shard_size 8 (global batch 8), logit-normal timesteps, 480x832, 300 prompt
tokens; checkpoints every 30 steps; its validation samples at guidance 4.5 / 50 steps (sample.*).
It keeps bf16 parameters; here fp32 master weights and bf16 compute. Unlike cosmos-rl, the video
instruction prefix is used in training as in validation, the Gemma mask reaches the
cross-attention, and clips have train_frames frames (spec video_models.md §5.3).
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/sana_video_sft"
    c.train.max_steps = 2000
    c.train.train_batch_per_replica = 8  # global: 1 per replica x dp_shard_size 8
    c.train.optm_lr = 1e-6
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-6
    c.train.optm_warmup_steps = 20
    c.train.ckpt.save_freq = 30
    c.train.ckpt.max_keep = 3
    c.policy.model_name_or_path = "Efficient-Large-Model/SANA-Video_2B_480p_diffusers"
    c.policy.family = "sana_video"
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
    # dp_shard_size 8: parameters sharded over every device, blocks rematerialised
    # (model_gradient_checkpointing)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.policy.remat = "nothing_saveable"
    return c
