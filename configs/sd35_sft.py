"""Full fine-tune of SD3.5-Medium on your own images (rectified-flow SFT, as diffusers' SD3
training script: shifted logit-normal timesteps, uniform weighting, target noise - x0).

    python -m wfm_jax.main --config configs/sd35_sft.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/images   # X.json + X.jpg|png

fp32 master weights, AdamW moments and EMA, bf16 compute; parameters sharded over
policy.parallelism.fsdp devices (FSDP), the batch over data x fsdp.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sd35_medium.py")
    c.train.train_batch_per_replica = 32  # global batch
    c.train.optm_lr = 1e-5
    c.train.optm_warmup_steps = 100
    c.train.ema_decay = 0.999
    c.train.ckpt.save_freq = 200
    c.train.ckpt.max_keep = 3
    # FSDP over every device: replicated, the fp32 weights, moments, EMA and grads alone are
    # ~37 GB per device. Several hosts: --config.policy.parallelism.data=HOSTS with fsdp=-1.
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    # every activation saved and the blocks unrolled: by the TPU cost model on v5p:2x2x1, 4 rows
    # a chip, 0.167 s a step against 0.229 s scanned with dots saved (30.4 GB a chip against
    # 22.9); 16 rows a chip reach an estimated 53% MFU (docs/tpu_tuning.md)
    c.policy.remat = "everything_saveable"
    c.policy.scan_layers = False
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: 4 rows a chip of the 32
    return c
