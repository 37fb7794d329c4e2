"""DDRL post-training of Cosmos-Predict2.5-2B at 720p: cosmos-rl's
cosmos_predict2-5_2b_720_reason_embedding_ddrl.toml (spec algorithms.md §4, video_models.md
§5.2; the 14B recipe, configs/cosmos25_14b_ddrl.py, is this one on the 14B checkpoint), FSDP
shards of 8 devices and context parallel 2 (cosmos-rl's); 256 GPUs recommended.

    python -m wfm_jax.main --config configs/cosmos25_2b_ddrl.py \
        --config.train.train_policy.dataset.local_dir=/path/to/dataset   # videos/ + metas/
"""
from wfm_jax.config.recipe import compose


def get_config():
    """cosmos-rl's values: full fine-tune, lr 1e-5, wd 1e-4, betas (0.9, 0.99), warm-up 50,
    clip 1, bf16, 2001 iterations; 8 rollouts per data item (num_rollout), EDM 2ab sampler on
    sigma in [0.01, 200] (rho 7; Cosmos' own scheduler range), 20 steps, churn 1, no CFG;
    train_on [0, 2, ..., 18], clip_ratio 1e-4, kl_beta 0 (the released configs; the RLConfig
    default is 0.01), data_beta 0.01, loss_scale 10, use_rl_sigma_and_noise, not
    data_on_first_only, exp_reward off, reference never updated; 93 frames at 720x1280;
    dataset in cosmos-rl's WFM layout (videos/*.mp4 + metas/*.txt). video2world as cosmos-rl's DDRL
    tomls: min_num_conditional_frames 0 and max 1 (the RLConfig default), i.e. each data item
    is text2world or conditioned on its clip's first latent frame, half and half."""
    c = compose("base/cosmos25_2b.py", algorithm="ddrl")
    c.train.max_steps = 2001
    c.train.train_batch_per_replica = 64  # 8 data items x 8 rollouts
    c.train.optm_lr = 1e-5
    c.train.optm_betas = (0.9, 0.99)
    c.train.optm_warmup_steps = 50
    c.train.ckpt.save_freq = 100
    tp = c.train.train_policy
    tp.dataset.layout = "wfm"
    tp.kl_beta = 0.0
    tp.update_ref_every_iter = 0
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    c.rollout.n_generation = 8
    d = c.policy.diffusers
    d.inference_size = (720, 1280)
    d.max_num_conditional_frames = 1
    s = d.sample
    s.solver = "edm"
    s.num_steps = 20
    s.deterministic_sampling = False
    # cosmos-rl's fsdp shard size and context-parallel size; data replicas over the rest (HSDP)
    c.policy.parallelism.data = -1
    c.policy.parallelism.fsdp = 8
    c.policy.parallelism.context = 2
    c.validation.enable = True
    c.validation.freq = 100
    c.validation.dataset.holdout_fraction = 0.01
    c.plan.target = "v5p:2x2x4"  # what it is planned to fit: 16 chips: its mesh is fsdp 8 x context 2
    return c
