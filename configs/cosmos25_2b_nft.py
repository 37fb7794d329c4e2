"""DiffusionNFT post-training of Cosmos-Predict2.5-2B (text2world): cosmos-rl's
cosmos-predict2-5-2b-720-nft.toml (spec video_models.md §5.2), 93 frames at 512x512.

    huggingface-cli download nvidia/Cosmos-Predict2.5-2B --revision diffusers/base/post-trained \
        --local-dir nvidia/Cosmos-Predict2.5-2B
    python -m wfm_jax.main --config configs/cosmos25_2b_nft.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt

cosmos-rl's values: LoRA r 32, alpha 64, gaussian init on to_q/to_k/to_v/to_out.0/ff.net.0.proj/
ff.net.2 (attn1 and attn2; crossattn_proj frozen); 512x512, 93 frames; 10 rollout steps, guidance
1 (no CFG), 12 videos per prompt, batch 576 (48 prompts x 12); kl_beta 1.0; deterministic dpm2 at
noise_level 0.7 (cosmos-rl swallows these three and always samples stochastically: wfm_jax
honours them). Timesteps: wfm_jax feeds the family 1000*sigma in rollout and training alike (the
Cosmos family divides by 1000 before the DiT); cosmos-rl feeds sigma at rollout and ~1000 sigma in
training. Text2world as cosmos-rl's diffusers NFT stack (it passes a zero condition mask);
video2world on a dataset of videos: --config.policy.diffusers.max_num_conditional_frames=1
--config.train.train_policy.dataset.local_dir=/path/to/wfm (videos/ + metas/).
Optimizer values cosmos-rl's NFT recipes share (lr 3e-4, wd 1e-4, betas (0.9, 0.999), clip 1.0,
EMA 0.9 every step, bf16 params).
"""
from wfm_jax.config.recipe import compose
from wfm_jax.config.schema import COSMOS_LORA_TARGETS


def get_config():
    c = compose("base/cosmos25_2b.py", algorithm="nft")
    c.train.param_dtype = "bfloat16"
    c.train.train_batch_per_replica = 576  # 48 prompts x 12 videos
    tp = c.train.train_policy
    tp.mini_batch = 4
    tp.kl_beta = 1.0
    tp.global_std = False  # cosmos-rl's remote-reward advantages: per-prompt mean and std
    tp.std_ddof = 1
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    c.rollout.n_generation = 12
    c.policy.lora.enable = True
    c.policy.lora.target_modules = COSMOS_LORA_TARGETS
    c.validation.enable = True
    # FSDP over every chip: the frozen DiT, the Qwen2.5-VL-7B text tower and the VAE are split
    # over them (data-parallel kept a whole 16.8 GB copy of the text tower + VAE on each chip)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
