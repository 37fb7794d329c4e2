"""Cosmos-Reason2-2B SFT with the released recipe's settings (cosmos-reason2
examples/cosmos_rl/configs/llava_sft.toml; specs/reason2.md §4.4): LLaVA conversations, loss on
the assistant tokens and their <|im_end|>, full fine-tune, AdamW lr 1e-6, betas (0.9, 0.999),
weight decay 0.01, eps 1e-6, 20 linear warm-up steps then constant, clip 1.0, fp32 master weights
and bf16 compute, rows cut at 4096 tokens, 32 conversations per optimizer update.

    python -m wfm_jax.main --config configs/reason2_2b_sft.py \\
        --config.policy.model_name_or_path=/path/to/Cosmos-Reason2-2B \\
        --config.train.train_policy.dataset.local_dir=/path/to/llava_annotations_dir

wfm_jax downloads nothing: policy.model_name_or_path must be a local copy of
nvidia/Cosmos-Reason2-2B (config.json, model.safetensors*, tokenizer and processor files); without
it the run stops with one line naming the directory. Differences from cosmos-rl: the batch size
here is global (cosmos-rl's train_batch_per_replica is per data-parallel replica), and the 32
rows form one token-mean (cosmos-rl averages per mini-batch of 4 and accumulates 8 of them:
set train_batch_per_replica=4 and grad_accum_steps=8 for that). The run is one epoch over the
data set, as in cosmos-rl, capped at max_steps (config/run_length.py).
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("base/reason2_2b.py")
    c.train.max_steps = 1000  # a cap on the epoch's steps (cosmos-rl's max_num_steps; none there)
    c.train.train_batch_per_replica = 32
    c.train.optm_lr = 1e-6
    c.train.optm_betas = (0.9, 0.999)  # released value
    c.train.epoch = 1  # released value: one pass over the conversations
    c.train.ckpt.save_freq = 100
    c.train.train_policy.mini_batch = 4
    c.train.train_policy.dataset.local_dir = "./data/reason2_llava_sft"
    # planned at 56.6 GiB per device on 8 (4 rows of 4096 tokens + a 512^2 image each): fits an
    # 80 GB GPU; data-parallel without remat needs 427 GiB (docs/sharding_and_memory.md)
    c.policy.vlm.model_max_length = 4096  # released policy.model_max_length
    c.plan.target = "v5p:2x2x2"  # what it is planned to fit: 8 chips: 4 conversations a chip of the 32
    return c
