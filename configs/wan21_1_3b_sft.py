"""Full fine-tune of Wan2.1-T2V-1.3B on your own videos (rectified-flow SFT): 81 frames at
480x832, the released model's defaults (spec video_models.md §1.2).

    huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers \
        --local-dir Wan-AI/Wan2.1-T2V-1.3B-Diffusers
    python -m wfm_jax.main --config configs/wan21_1_3b_sft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/videos   # X.json + X.mp4

policy.model_name_or_path is the local download (override it to point elsewhere). fp32 master
weights, AdamW moments and EMA, bf16 compute with Wan's fp32 islands (norms, modulation, time
embedding); parameters sharded over every device (FSDP), each block rematerialised.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/wan21_1_3b.py")
    # global batch: one 81-frame clip per device on 8 GPUs (cosmos-rl's SANA-Video SFT trains one
    # clip per replica, sana-video-sft.toml)
    c.train.train_batch_per_replica = 8
    c.train.optm_lr = 1e-5  # as sd35_sft (cosmos-rl's SANA-Video SFT: 1e-6 at batch 1)
    c.train.optm_warmup_steps = 100
    c.train.ema_decay = 0.999
    c.train.ckpt.save_freq = 200
    c.train.ckpt.max_keep = 3
    d = c.policy.diffusers
    d.weighting_scheme = "logit_normal"  # cosmos-rl's SANA-Video SFT
    # validation samples as WanPipeline does: 50 steps, CFG 5 (v_u + 5 (v_c - v_u))
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 5.0
    # FSDP over every device; 1.3B fits without context parallelism at 480p with remat; more
    # hosts: --config.policy.parallelism.data=HOSTS; longer clips: --config.policy.parallelism.context=2
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips, 2 clips a chip
    return c
