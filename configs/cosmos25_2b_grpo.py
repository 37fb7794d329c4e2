"""Flow-GRPO post-training of Cosmos-Predict2.5-2B: cosmos-rl's 480 GRPO recipe
(cosmos-predict2-5-2b-480-grpo*.toml, native WFM stack; spec video_models.md §5.2): 93 frames at
432x768 (its video_size [768, 432]), context parallel 1.

    python -m wfm_jax.main --config configs/cosmos25_2b_grpo.py \
        --config.train.train_policy.dataset.local_dir=/path/to/prompts.txt
    python -m wfm_jax.main --config configs/cosmos25_2b_grpo.py:mock_data   # no dataset

`:mock_data` (cosmos-rl's ...-480-grpo-mock-data.toml, a quick rollout of the pipeline) trains on
the bundled prompt file configs/prompts/tiny.txt instead of a dataset.

cosmos-rl's values (RLConfig defaults, config/wfm/__init__.py): num_rollout 2 videos per prompt,
10 sample steps, no CFG (guidance 0 in its form: w = 1 in the standard one), clip_ratio 1e-4,
kl_beta 0.01, use_same_seed within a group. Its native stack samples with EDM 2ab + churn; the
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

from wfm_jax.config.schema import default_config

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "nvidia/Cosmos-Predict2.5-2B"  # revision diffusers/base/post-trained


def get_config(arg=None):
    if arg not in (None, "", "mock_data"):
        raise ValueError(f"unknown recipe argument {arg!r}; the one argument is 'mock_data'")
    c = default_config()
    c.train.output_dir = "./outputs/cosmos25_2b_grpo"
    c.train.train_policy.type = "grpo"
    c.train.max_steps = 2000
    c.train.train_batch_per_replica = 64  # 32 prompts x 2 rollouts
    c.train.optm_lr = 1e-5
    c.train.ema_enable = True
    c.train.ckpt.save_freq = 50
    tp = c.train.train_policy
    tp.kl_beta = 0.01
    tp.use_remote_reward = True
    tp.remote_reward.reward_fns = [
        {"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    if arg == "mock_data":
        c.train.output_dir = "./outputs/cosmos25_2b_grpo_mock"
        tp.dataset.local_dir = os.path.join(HERE, "prompts", "tiny.txt")
    c.rollout.n_generation = 2  # num_rollout
    c.policy.model_name_or_path = MODEL
    c.policy.family = "cosmos"
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (432, 768)  # cosmos-rl video_size [W, H] = [768, 432]
    d.train_frames = 93
    d.inference_frames = 93
    d.max_prompt_length = 512
    d.sample.eval_num_steps = 36
    d.sample.solver = "sde"
    d.sample.deterministic_sampling = False
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.policy.remat = "nothing_saveable"
    c.validation.enable = True
    c.validation.freq = 50
    return c
