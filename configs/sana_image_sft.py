"""Full fine-tune of SANA1.5 1.6B on your own images (rectified-flow SFT): cosmos-rl's
configs/sana/sana-image-sft.toml.

    huggingface-cli download Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers \
        --local-dir Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers
    python -m wfm_jax.main --config configs/sana_image_sft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/images   # X.json + X.jpg|png

cosmos-rl's values: AdamW lr 1e-4, weight decay 0.01, eps 1e-5, no warmup, clip 1.0; one image
per replica on dp_shard_size 8 (global batch 8), logit-normal timesteps, 1024x1024, 300 prompt
tokens; checkpoints every 30 steps; its validation samples at guidance 4.5 / 50 steps (kept in
sample.*). It keeps bf16 parameters; here fp32 master weights and bf16 compute (as sd35_sft).
Unlike cosmos-rl, the text goes through SANA's complex-human-instruction prefix in training as in validation, and the
Gemma mask reaches the cross-attention (spec video_models.md §5.3).
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sana_image.py")
    c.train.train_batch_per_replica = 8  # global: 1 per replica x dp_shard_size 8
    # data-parallel, not cosmos-rl's FSDP: the 19.3 GB train state fits one chip, and at one image
    # a chip FSDP's weight gathers set the pace. Planned on v5p:2x2x2 (docs/recipe_targets.md):
    # step 0.147 -> 0.095 s (17.6 -> 27.2% MFU), validation sample 4.39 -> 1.20 s, peak 7.1 -> 34.1 GB
    c.policy.parallelism.data = -1
    c.policy.parallelism.fsdp = 1
    c.train.optm_lr = 1e-4
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-5
    c.train.ckpt.save_freq = 30
    c.train.ckpt.max_keep = 3
    d = c.policy.diffusers
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 4.5
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: one image a chip, as on 8 GPUs
    return c
