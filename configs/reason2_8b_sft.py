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
"""
from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS, default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/reason2_8b_sft"
    c.train.max_steps = 1000  # pinned: the run length (cosmos-rl: one epoch over the data)
    c.train.seed = 0
    c.train.param_dtype = "float32"  # released: fp32 master weights
    c.train.compute_dtype = "bfloat16"  # released: bf16 compute
    c.train.train_batch_per_replica = 32
    c.train.optm_lr = 1e-6
    c.train.optm_betas = (0.9, 0.999)  # released value
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-6
    c.train.optm_warmup_steps = 20
    c.train.lr_schedule = "constant"  # released: no decay after warm-up
    c.train.optm_grad_norm_clip = 1.0  # released value
    c.train.epoch = 1  # released value (the run length is max_steps here)
    c.train.ckpt.save_freq = 100
    c.train.train_policy.mini_batch = 4
    ds = c.train.train_policy.dataset
    ds.layout = "conversations"
    ds.local_dir = "./data/reason2_llava_sft"
    c.policy.family = "qwen3_vl"
    c.policy.model_name_or_path = "./checkpoints/Cosmos-Reason2-8B"
    c.policy.lora.target_modules = QWEN3_VL_LORA_TARGETS
    v = c.policy.vlm
    v.model_max_length = 4096  # released policy.model_max_length
    v.train_vision = True  # a full fine-tune, vision tower included
    v.system_prompt = ""  # released (llava example): no system turn
    v.pad_to_multiple = 64
    v.max_new_tokens = 256
    return c
