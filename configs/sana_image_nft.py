"""DiffusionNFT post-training of SANA1.5 1.6B: cosmos-rl's configs/sana/sana-image-nft.toml.

    huggingface-cli download Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers \
        --local-dir Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers
    python -m wfm_jax.main --config configs/sana_image_nft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt

cosmos-rl's values: LoRA r 4 / alpha 4 gaussian on attn1/attn2 q, k, v, out (the "default" and
"old" adapters); fp32; 1024x1024, 300 prompt tokens; 10 rollout steps without CFG, 40 for
evaluation; 24 images per prompt, global batch 1152 (6 x 24 x 8), mini_batch 9; AdamW lr 3e-4,
weight decay 1e-4, clip 1.0; EMA 0.9 every step; kl_beta 1e-4, nft_beta 1, timestep fraction
0.99, advantages clipped to [-5, 5], old-policy decay type 1; PickScore from the reward service;
checkpoints every 20 steps; dp_shard_size 8 with gradient checkpointing.

The rollout sampler: the toml says solver "euler", but cosmos-rl's SANA rollout ignores it and
steps the pipeline's DPM-Solver++ scheduler (spec video_models.md §5.3), so sample.solver is
"dpm_solver", on its own sigma grid and truncated timesteps; the update trains on the flow grid at
1000 sigma. Unlike cosmos-rl, the instruction prefix is the same in rollout, training and
validation, and the Gemma mask reaches the cross-attention in the update as in the rollout.
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import SANA_LORA_TARGETS


def get_config():
    c = compose("base/sana_image.py", algorithm="nft")
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 1152  # 6 x 24 x 8
    c.train.train_policy.mini_batch = 9
    c.train.ema_enable = True
    # cosmos-rl's remote-reward advantages: per-prompt mean and unbiased std (as sd35_nft)
    c.train.train_policy.global_std = False
    c.train.train_policy.std_ddof = 1
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "pickscore", "weight": 1.0, "score_key": "pickscore"}]
    c.policy.lora.enable = True
    c.policy.lora.r = 4
    c.policy.lora.lora_alpha = 4
    c.policy.lora.target_modules = SANA_LORA_TARGETS
    d = c.policy.diffusers
    d.sample.noise_level = 1.0  # unused by a deterministic rollout (as in cosmos-rl)
    d.sample.solver = "dpm_solver"
    c.validation.enable = False  # as the toml; on: validation.enable=True and dataset.local_dir
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
