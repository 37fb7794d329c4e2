"""Flow-GRPO post-training of Cosmos-Predict2.5-2B at the size of cosmos-rl's 480 GRPO recipe:
93 frames at 432x768, context parallel 1. Not what cosmos-rl's own "GRPO" recipes run (that is
its world-model RL step: configs/cosmos25_2b_flow_grpo.py, train_policy.type "wfm_rl"); this is
Flow-GRPO (train_policy.type "grpo") on the same model, for comparison.

    python -m wfm_jax.main --config configs/cosmos25_2b_flow_grpo.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt
    python -m wfm_jax.main --config configs/cosmos25_2b_flow_grpo.py:mock_data   # no dataset

`:mock_data` (a quick rollout of the pipeline) trains on the bundled prompt file
configs/prompts/tiny.txt instead of a dataset.

Values: 2 videos per prompt, 10 sample steps, no CFG, clip_ratio 1e-4, kl_beta 0.01. cosmos-rl's
native stack samples with EDM 2ab + churn; the
Flow-GRPO log-prob needs the flow SDE, which wfm_jax runs on Cosmos' Karras flow-sigma range
(the family's sampler_schedule) with noise_level 0.7. Full fine-tune (the native stack has no
LoRA), bf16 compute on fp32 master weights. Text2world (conditional frames 0); video2world
as cosmos-rl's world-model stack (RLConfig default min = max = 1) on a dataset of videos:
    --config.policy.diffusers.max_num_conditional_frames=1 \
    --config.train.train_policy.dataset.local_dir=/path/to/wfm   # videos/ + metas/
(each item's clip window and count fixed by (seed, step, item); with CFG both branches see the
frames; the conditioned latent frames add nothing to the loss: their velocity is exact).
"""
import os

from wfm_jax.config.recipe import compose

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config(arg=None):
    if arg not in (None, "", "mock_data"):
        raise ValueError(f"unknown recipe argument {arg!r}; the one argument is 'mock_data'")
    c = compose("base/cosmos25_2b.py", algorithm="grpo")
    c.train.train_batch_per_replica = 64  # 32 prompts x 2 rollouts
    c.train.optm_lr = 1e-5
    c.train.ckpt.save_freq = 50
    tp = c.train.train_policy
    tp.kl_beta = 0.01
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    if arg == "mock_data":
        c.train.output_dir = "./outputs/cosmos25_2b_flow_grpo_mock"
        tp.dataset.local_dir = os.path.join(HERE, "prompts", "tiny.txt")
    c.rollout.n_generation = 2  # num_rollout
    d = c.policy.diffusers
    d.inference_size = (432, 768)  # cosmos-rl video_size [W, H] = [768, 432]
    d.sample.solver = "sde"
    d.sample.deterministic_sampling = False
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.validation.enable = True
    c.validation.freq = 50
    c.plan.target = "v5p:2x2x1"  # what it is planned to fit: 4 chips
    return c
