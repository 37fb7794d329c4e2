"""What every tiny RL recipe adds to configs/base/tiny.py: 20 steps of 4 samples per prompt,
with a checkpoint and a validation grid every 10 (fast samplers: 10 evaluation steps).
`compose("base/tiny_rl.py:wan", algorithm="nft")` picks the family (default sd3).
"""
from wfm_jax.config.recipe import compose


def get_config(family="sd3"):
    c = compose(f"tiny.py:{family}")
    c.train.max_steps = 20
    c.train.ckpt.save_freq = 10
    c.rollout.n_generation = 4
    c.policy.diffusers.sample.eval_num_steps = 10
    c.validation.enable = True
    c.validation.freq = 10
    return c
