"""Flow-GRPO post-training of Wan2.1-T2V-1.3B: flow_grpo's SD3.5 recipe (configs/sd35_grpo.py)
with Wan's CFG 5 and cosmos-rl's video group sizes (8 videos per prompt), 81 frames at 480x832.

    huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers \
        --local-dir Wan-AI/Wan2.1-T2V-1.3B-Diffusers
    python -m wfm_jax.main --config configs/wan21_1_3b_grpo.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt

10 SDE steps (a = 0.7) with CFG 5 for rollouts (both branches, as WanPipeline), the first 9
trained; 50 ODE steps with CFG 5 and EMA weights for validation. Flow-GRPO-Fast (train a window
of 2 steps): --config.policy.diffusers.sample.sde_window_size=2
--config.policy.diffusers.sample.solver=cps.
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import WAN_LORA_TARGETS


def get_config():
    c = compose("base/wan21_1_3b.py", algorithm="grpo")
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 384  # 48 prompts x 8 videos, as the video NFT recipe
    c.train.train_policy.mini_batch = 4
    c.train.train_policy.kl_beta = 0.01  # flow_grpo's PickScore value (sd35_grpo)
    c.train.train_policy.global_std = True  # flow_grpo: per-prompt mean, batch population std
    c.train.train_policy.cfg_detach_uncond = True  # as sd35_grpo (flow_grpo's published runs)
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    c.rollout.n_generation = 8
    c.policy.lora.enable = True
    c.policy.lora.target_modules = WAN_LORA_TARGETS
    d = c.policy.diffusers
    d.sample.eval_num_steps = 50
    d.sample.guidance_scale = 5.0  # WanPipeline's default
    d.sample.solver = "sde"
    d.sample.deterministic_sampling = False
    c.validation.enable = True
    # FSDP over every chip: the UMT5-XXL text tower (11.6 GB a chip when replicated) and the
    # frozen DiT split; the plan's CPU screen of the update: 112.9 GB data-parallel, 97.1 GB so
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
