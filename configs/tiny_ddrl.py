"""DDRL on the tiny SD3 pipeline pretrained on the shapes world (built once on first use, see
configs/tiny_nft.py), rewarded by `shapes_alignment`, its data loss on the generated shapes
dataset (16 images, 32x32, the train split's scenes, built on first use); no download, a few
minutes on 2 CPU cores.

    python -m wfm_jax.main --config configs/tiny_ddrl.py
"""
from wfm_jax.config.recipe import compose
from wfm_jax.worlds.shapes.recipe import use_shapes_world


def get_config():
    c = compose("base/tiny_rl.py", algorithm="ddrl")
    c.train.train_batch_per_replica = 16  # 4 data items x 4 rollouts
    c.train.train_policy.mini_batch = 8
    c.train.optm_lr = 5e-4  # 5e-3 (the random model's value) wrecks the pretrained model
    c.train.optm_betas = (0.9, 0.99)
    tp = c.train.train_policy
    tp.dataset.local_dir = "./outputs/tiny_shapes"
    tp.dataset.build_tiny = True
    tp.train_on = (0, 2, 4, 6, -1)
    tp.kl_beta = 0.0
    # cosmos-rl (and sd35_ddrl.py) use False; the tiny recipe keeps True, the setting the
    # README's tiny RL curves were measured with
    tp.exp_reward = True
    tp.data_on_first_only = True  # speed on 2 CPU cores: one data-loss forward per batch
    tp.update_ref_every_iter = 0
    c.policy.diffusers.sample.solver = "edm"
    return use_shapes_world(c, prompts=False)
