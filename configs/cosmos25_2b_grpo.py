"""cosmos-rl's world-model "GRPO" on Cosmos-Predict2.5-2B: its 480 GRPO recipe
(cosmos-predict2-5-2b-480-grpo*.toml, native WFM stack; spec cosmos_rl_wfm.md §1), run by the
"wfm_rl" algorithm (cosmos-rl's one world-model RL step; it is not Flow-GRPO, which stays
available as train_policy.type = "grpo"). 93 frames at 432x768 (its video_size [768, 432]),
video2world on one conditional latent frame, context parallel 1.

    python -m wfm_jax.main --config configs/cosmos25_2b_grpo.py \
        --config.train.train_policy.dataset.local_dir=/path/to/wfm   # videos/ + metas/ (+ t5_xxl/)
    python -m wfm_jax.main --config configs/cosmos25_2b_grpo.py:mock_data   # no dataset

`:mock_data` is cosmos-rl's ...-480-grpo-mock-data.toml: random videos and T5-like text
embeddings of the recipe's shapes (wfm_jax.data.mock), 25 iterations, the built-in JPEG reward.

cosmos-rl's values (RLConfig defaults, the "GRPO" recipes have no [model.rl]): 8 rollouts per
data item sharing their initial noise, EDM 2ab sampler with churn over 10 steps (sigma 200 ->
0.01), steps 0..7 trained, clip_ratio 1e-4, kl_beta 0.01 to a reference refreshed every 16
iterations, no data term, no CFG (guidance 0), advantages over the group's unbiased std clamped
to +-5, loss x10. Full fine-tune, AdamW lr 1e-5 betas (0.9, 0.99) wd 1e-4 after a 50-step
warm-up, grad clip 1, bf16 compute on fp32 master weights, EMA.
"""
import os

from wfm_jax.config.recipe import compose

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
    if arg not in (None, "", "mock_data"):
        raise ValueError(f"unknown recipe argument {arg!r}; the one argument is 'mock_data'")
    c = compose("base/cosmos25_2b.py", algorithm="wfm_rl")
    c.train.max_steps = 2001
    c.train.train_batch_per_replica = 8  # one group: 8 data-parallel ranks x 1 video
    c.train.optm_lr = 1e-5  # weight decay 1e-4, eps 1e-8, grad clip 1, constant after warm-up: the defaults
    c.train.optm_betas = (0.9, 0.99)
    c.train.optm_warmup_steps = 50
    c.train.ckpt.save_freq = 1000  # cosmos-rl's save_iter
    tp = c.train.train_policy
    # train_policy.wfm keeps cosmos-rl's RLConfig defaults (schema.py), as the recipe does
    tp.use_remote_reward = True
    tp.remote_reward.media_type = "latent"  # cosmos-rl sends the latents
    tp.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    tp.dataset.layout = "wfm"
    c.rollout.n_generation = 8  # num_rollout
    d = c.policy.diffusers
    d.inference_size = (432, 768)  # cosmos-rl video_size [W, H] = [768, 432]
    d.min_num_conditional_frames = d.max_num_conditional_frames = 1
    d.sample.eval_num_steps = 35
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.validation.enable = False  # cosmos-rl's visualisation samples the RL batch itself
    if arg == "mock_data":
        c.train.output_dir = "./outputs/cosmos25_2b_grpo_mock"
        c.train.max_steps = 25
        c.train.optm_warmup_steps = 1000  # the mock recipe keeps cosmos-rl's default warm-up
        tp.dataset.layout = "mock"
        tp.dataset.local_dir = ""
        tp.dataset.mock_text_dim = 1024
        tp.use_remote_reward = False
        tp.remote_reward.media_type = "pixels"
        tp.remote_reward.reward_fns = [
            {"name": "jpeg_compressibility", "weight": 1.0, "score_key": ""}]
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: one rollout a chip, as cosmos-rl's 8 ranks
    return c
