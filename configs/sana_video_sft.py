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
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sana_video.py")
    c.train.train_batch_per_replica = 8  # global: 1 per replica x dp_shard_size 8
    # data-parallel, not cosmos-rl's FSDP: the 24.7 GB train state fits one chip, and at one clip
    # a chip FSDP's weight gathers set the pace. Planned on v5p:2x2x2 (docs/recipe_targets.md):
    # step 2.90 -> 1.97 s (36.3 -> 53.6% MFU), validation sample 99.8 -> 47.4 s, peak 31.1 -> 70.9 GB
    c.policy.parallelism.data = -1
    c.policy.parallelism.fsdp = 1
    c.train.optm_lr = 1e-6
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-6
    c.train.optm_warmup_steps = 20
    c.train.ckpt.save_freq = 30
    c.train.ckpt.max_keep = 3
    d = c.policy.diffusers
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 4.5
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: one clip a chip, as on 8 GPUs
    return c
