"""Flow-GRPO post-training of SD3.5-Medium (flow_grpo's SD3.5 PickScore recipe, spec §2, §5).

    python -m wfm_jax.main --config configs/sd35_grpo.py \
        --config.policy.model_name_or_path=/path/to/stable-diffusion-3.5-medium \
        --config.train.train_policy.dataset.local_dir=/path/to/pickscore

10 SDE steps (a = 0.7) with CFG 4.5 for rollouts, the first 9 trained; 40-step ODE with CFG 4.5
and EMA weights for validation. The reference trains 2 optimizer steps on each epoch of
48 prompts x 24 images; here one batch of 24 x 24 is one optimizer step (same samples per step).
To follow it exactly: --config.train.train_batch_per_replica=1152
--config.train.train_policy.batch_size_per_optimize=576 (each inner epoch shuffles the batch and
takes one optimizer step per 576 samples).

Flow-GRPO-Fast (spec §2): --config.policy.diffusers.sample.sde_window_size=2
--config.policy.diffusers.sample.solver=cps --config.policy.diffusers.sample.noise_level=0.8
--config.train.train_policy.clip_range=1e-5 --config.train.train_policy.kl_beta=0
(and guidance_scale=1 for the no-CFG variant, sde_window_size=3, sde_window_range="(0, 5)").
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/sd35_medium.py", algorithm="grpo")
    c.train.max_steps = 4000
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 576  # 24 prompts x 24 images
    c.train.train_policy.mini_batch = 9
    c.train.train_policy.mu_iterations = 1  # num_inner_epochs
    c.train.train_policy.kl_beta = 0.01  # PickScore; 0.04 for GenEval / OCR
    c.train.train_policy.global_std = True  # flow_grpo: per-prompt mean, batch population std
    # CFG's unconditional branch detached in the update, as flow_grpo's SD3 script did when its
    # results were published (it saves a backward pass); its later code does not detach: False.
    c.train.train_policy.cfg_detach_uncond = True
    # flow_grpo drops zero-advantage samples before batching; wfm_jax keeps them (their policy
    # term is 0) unless this is True (then both loss means skip them)
    c.train.train_policy.filter_zero_advantage = False
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "pickscore", "weight": 1.0, "score_key": ""}]
    c.policy.lora.enable = True
    d = c.policy.diffusers
    d.sample.guidance_scale = 4.5
    d.sample.solver = "sde"
    d.sample.deterministic_sampling = False
    c.validation.enable = True
    c.validation.batch_size = 16
    # each block rematerialised: the update runs the CFG pair (cond and uncond), and keeping every
    # activation of 9 rows a device took 159.8 GB of temporaries on the planner's CPU count
    # (nothing_saveable: 21.1 GB; docs/recipe_targets.md)
    c.policy.remat = "nothing_saveable"
    # the norms' own checkpoints off: on v5p:2x2x1 the update then takes an estimated 80.75 s
    # against 84.68 s (48.0% against 45.8%) for 1.5 GB a chip more (29.22 GB), with room to
    # spare (docs/recipe_targets.md, session 50)
    c.policy.norm_checkpoints = False
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
