"""Full fine-tune of Cosmos-Predict2.5-2B on your own videos (rectified-flow SFT, text2world):
93 frames at 704x1280 (the pipeline's defaults). cosmos-rl ships no Cosmos SFT recipe (its SFT
step passes no condition/padding mask, so it cannot run: spec video_models.md §5.1); these are
the values of its other SFT recipes and the Wan one (configs/wan21_1_3b_sft.py).

    python -m wfm_jax.main --config configs/cosmos25_2b_sft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/videos   # X.json + X.mp4

fp32 master weights, bf16 compute; FSDP over every device, each block rematerialised. The
timestep the DiT sees is sigma (the family converts wfm_jax's 1000 sigma).
video2world: --config.policy.diffusers.max_num_conditional_frames=1 (or 2; min_... for a
mix) conditions each clip on its first latent frames (their loss is zero: the velocity there
is exact).
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/cosmos25_2b.py")
    c.train.train_batch_per_replica = 8  # one clip per device on 8 GPUs
    c.train.optm_lr = 1e-5
    c.train.optm_warmup_steps = 100
    c.train.ema_decay = 0.999
    c.train.ckpt.save_freq = 200
    c.train.ckpt.max_keep = 3
    d = c.policy.diffusers
    d.inference_size = (704, 1280)  # Cosmos2_5_PredictBasePipeline's defaults
    d.sample.guidance_scale = 7.0   # Cosmos' CFG form v_c + w (v_c - v_u)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: one clip a chip, as on 8 GPUs
    return c
