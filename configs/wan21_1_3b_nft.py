"""DiffusionNFT post-training of Wan2.1-T2V-1.3B: cosmos-rl's video NFT recipes (SANA-Video's
sana-video-nft.toml for the 480x832 group and batch sizes, Cosmos-Predict2.5's
cosmos-predict2-5-2b-720-nft.toml for the LoRA and the sampler) on 81-frame Wan clips.

    huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B-Diffusers \
        --local-dir Wan-AI/Wan2.1-T2V-1.3B-Diffusers
    python -m wfm_jax.main --config configs/wan21_1_3b_nft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt

The reward comes from a running reward service (REMOTE_REWARD_ENQUEUE_URL / _FETCH_URL /
_TOKEN, or train.train_policy.remote_reward.*) that scores videos: cosmos-rl's video recipes ask
for `dance_grpo` and read its `overall_reward`.
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import WAN_LORA_TARGETS


def get_config():
    c = compose("base/wan21_1_3b.py", algorithm="nft")
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 384  # 48 prompts x 8 videos (sana-video-nft: 6*8*8)
    c.train.train_policy.mini_batch = 4    # sana-video-nft
    # sana-video-nft (cosmos-predict2-5-2b-720-nft uses 1.0 with its larger LoRA)
    c.train.train_policy.kl_beta = 1e-4
    # cosmos-rl's remote-reward advantages: per-prompt mean and unbiased std (as sd35_nft)
    c.train.train_policy.global_std = False
    c.train.train_policy.std_ddof = 1
    c.train.train_policy.use_remote_reward = True
    c.train.train_policy.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    c.rollout.n_generation = 8  # sana-video-nft
    c.policy.lora.enable = True  # the "default" and "old" adapters
    c.policy.lora.target_modules = WAN_LORA_TARGETS
    # cosmos-predict2-5-2b-720-nft: 10 deterministic dpm2 steps without CFG, 40 for evaluation
    c.policy.diffusers.sample.num_steps = 10
    c.validation.enable = True
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
