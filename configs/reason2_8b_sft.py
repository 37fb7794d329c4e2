"""Cosmos-Reason2-8B SFT with the released recipe's settings (those of configs/reason2_2b_sft.py:
cosmos-reason2 examples/cosmos_rl/configs/llava_sft.toml, specs/reason2.md §4.4) on
nvidia/Cosmos-Reason2-8B (Qwen3-VL-8B: 36 decoder layers of 4096, untied lm_head, a 27-block
vision tower): full fine-tune, AdamW lr 1e-6, fp32 master weights, bf16 compute, rows cut at 4096
tokens, 32 conversations per optimizer update.

    python -m wfm_jax.main --config configs/reason2_8b_sft.py \\
        --config.policy.model_name_or_path=/path/to/Cosmos-Reason2-8B \\
        --config.train.train_policy.dataset.local_dir=/path/to/llava_annotations_dir

Per-device memory before any weight is read (figures: docs/sharding_and_memory.md):

    python -m wfm_jax.plan --config configs/reason2_8b_sft.py --devices 8 --device-kind h100

With the 2B recipe's layout (fsdp over every device, nothing_saveable remat) the plan on 8 devices
is 91.9 GiB per device: an H200 (141 GB) holds it, an 80 GB H100 does not (use 16 devices, or
--config.train.train_batch_per_replica=16 with --config.train.grad_accum_steps=2, which halves
the activations per device; that one is not planned yet).
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("reason2_2b_sft.py")  # the released recipe's settings; output ./outputs/reason2_8b_sft
    c.policy.model_name_or_path = "./checkpoints/Cosmos-Reason2-8B"
    return c
