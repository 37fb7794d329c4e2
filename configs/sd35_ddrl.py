"""DDRL post-training of SD3.5-Medium with cosmos-rl's DDRL hyper-parameters (spec §4).

    python -m wfm_jax.main --config configs/sd35_ddrl.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/paired_images

The dataset is the SFT paired layout (X.json with "prompt" + X.jpg|png): each batch takes 8 data
items, rolls each out 8 times from its caption (EDM sampler, 20 steps, churn 1, no CFG), and the
images regularise the policy through the diffusion loss (data_beta). Full fine-tune, as cosmos-rl.
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sd35_medium.py", algorithm="ddrl")
    c.train.max_steps = 2001
    c.train.param_dtype = "float32"  # fp32 master weights, bf16 compute
    c.train.train_batch_per_replica = 64  # 8 data items x 8 rollouts
    c.train.optm_lr = 1e-5
    c.train.optm_betas = (0.9, 0.99)
    c.train.optm_warmup_steps = 50
    c.train.ckpt.save_freq = 100
    tp = c.train.train_policy
    tp.kl_beta = 0.0
    tp.exp_reward = False  # cosmos-rl's default and its released DDRL recipes
    tp.update_ref_every_iter = 0
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [{"name": "pickscore", "weight": 1.0, "score_key": ""}]
    c.rollout.n_generation = 8  # num_rollout
    s = c.policy.diffusers.sample
    s.solver = "edm"
    s.num_steps = 20
    s.deterministic_sampling = False
    # full fine-tune: weights, moments, EMA and the reference copy sharded over every device
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.validation.enable = True
    c.validation.freq = 100
    c.validation.batch_size = 16
    c.validation.dataset.holdout_fraction = 0.01
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
