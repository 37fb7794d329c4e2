"""Cosmos-Reason2-2B GRPO with the released Reason GRPO recipe's settings (cosmos-reason1
examples/post_training/configs/rl.toml, the recipe cosmos-reason2 shipped as
examples/post_training/configs/rl.toml until Dec 2025; specs/reason2.md §4.2 and §4.4): 16
prompts x 8 completions per step, rewards single_choice + format (weight 1 each), up to 6144 new
tokens at sampling temperature 1.0, the policy's log-probs at temperature 0.9, clip 0.2 / 0.2,
no KL, one mu-iteration, mini-batches of 2 completions, AdamW lr 2e-6, betas (0.9, 0.95),
weight decay 0.01, 20 warm-up steps then constant, clip 1.0, fp32 master weights and bf16 compute.
Each optimizer update's 128 rows run as 16 micro-batches of 8 (train.grad_accum_steps), whose
weighted gradients sum to the whole update's.

    python -m wfm_jax.main --config configs/reason2_2b_grpo.py \\
        --config.policy.model_name_or_path=/path/to/Cosmos-Reason2-2B-or-its-SFT-export \\
        --config.train.train_policy.dataset.local_dir=/path/to/llava_qa_dir
    python -m wfm_jax.plan --config configs/reason2_2b_grpo.py --vision-blocks 3   # memory first

Data: LLaVA-style records whose first human turn is the question (with its image or video) and
whose "answer" is the reference letter. wfm_jax downloads nothing: without the model directory
the run stops with one line naming it. Differences from cosmos-rl: the batch is global (cosmos-rl's
train_batch_per_replica is per replica), rollout and update share one mesh and one process. The run
is 80 epochs over the prompts, as in cosmos-rl, capped at max_steps (config/run_length.py).
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/reason2_2b.py", "grpo")
    c.train.max_steps = 500  # a cap on the 80 epochs' steps (cosmos-rl's max_num_steps; none there)
    c.train.train_batch_per_replica = 128  # released: 16 prompts x rollout.n_generation 8
    c.rollout.n_generation = 8
    c.rollout.batch_size = 4  # released: 4 prompts (32 rows) per generate call
    c.train.optm_lr = 2e-6
    c.train.optm_betas = (0.9, 0.95)
    c.train.epoch = 80  # released value: passes over the prompts
    c.train.ckpt.save_freq = 20  # pinned: a checkpoint every 20 steps of a long run
    # the 128 rows of an optimizer update in 16 micro-batches of 8 (one row of 10240 tokens per
    # device on 8): the gradients add up to the whole update's (train/vlm_grpo.py)
    c.train.grad_accum_steps = 16
    tp = c.train.train_policy
    tp.mini_batch = 2
    tp.mu_iterations = 1  # released value
    tp.dataset.local_dir = "./data/reason2_grpo"
    g = tp.lm_grpo
    g.temperature = 0.9  # the policy's log-probs (train_policy.temperature)
    g.sampling_temperature = 1.0  # rollout.sampling_config.temperature (cosmos-rl's default)
    g.epsilon_low, g.epsilon_high = 0.2, 0.2  # released value
    g.kl_beta = 0.0  # released value
    g.max_response_length = 6144
    g.rewards = ("single_choice", "format")
    g.reward_weights = (1.0, 1.0)  # released value
    c.policy.vlm.model_max_length = 10240  # released policy.model_max_length: prompt + response
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips
    return c
