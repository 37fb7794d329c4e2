"""DDRL on a tiny random Cosmos-Predict2.5 pipeline: the shape of cosmos25_2b_ddrl.py (EDM 2ab
rollouts with churn on Cosmos' sigma range [0.01, 200], no CFG, policy + data loss,
text2world mixed with video2world on the clips' first frame) at 9 frames
of 32x32, rewarded by JPEG compressibility, its data loss on the tiny shapes clips (9-frame mp4s,
built on first use); no download, a few minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_cosmos_ddrl.py

A dataset in cosmos-rl's WFM layout (videos/*.mp4 + metas/*.txt) works the same:
--config.train.train_policy.dataset.local_dir=DIR --config.train.train_policy.dataset.layout=wfm
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/tiny_rl.py:cosmos", algorithm="ddrl")
    c.train.train_batch_per_replica = 16  # 4 data items x 4 rollouts
    c.train.train_policy.mini_batch = 2  # per device: 8 devices take the 16 rows at once
    c.train.optm_lr = 3e-3  # random tiny model
    c.train.optm_betas = (0.9, 0.99)
    tp = c.train.train_policy
    tp.dataset.local_dir = "./outputs/tiny_shape_clips"
    tp.dataset.build_tiny = True
    tp.train_on = (0, 2, 4, 6, -1)
    tp.kl_beta = 0.0
    tp.data_on_first_only = True  # speed on 2 CPU cores: one data-loss forward per batch
    tp.update_ref_every_iter = 0
    d = c.policy.diffusers
    # video2world as cosmos25_2b_ddrl.py: each item text2world or on its clip's first latent
    # frame (of 3), drawn per item
    d.min_num_conditional_frames = 0
    d.max_num_conditional_frames = 1
    d.sample.solver = "edm"
    c.validation.batch_size = 4
    c.validation.dataset.holdout_fraction = 0.25
    return c
