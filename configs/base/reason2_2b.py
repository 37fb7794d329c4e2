"""What every Cosmos-Reason2 recipe shares (configs/reason2_*.py start from it with
`compose("base/reason2_2b.py")`; the 8B one changes the checkpoint): the local checkpoint
directory, fp32 master weights and bf16 compute, the released recipes' AdamW settings that SFT
and GRPO have in common (weight decay 0.01, eps 1e-6, 20 warm-up steps then constant, clip 1.0),
no system turn, a full fine-tune with the vision tower, and wfm_jax's layout for it.

wfm_jax downloads nothing: policy.model_name_or_path must be a local copy of
nvidia/Cosmos-Reason2-2B (config.json, model.safetensors*, tokenizer and processor files); without
it a run stops with one line naming the directory.
"""
from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS, default_config


def get_config():
    c = default_config()
    c.train.seed = 0
    c.train.param_dtype = "float32"  # released: fp32 master weights (cosmos-rl's master_dtype)
    c.train.compute_dtype = "bfloat16"  # released: bf16 compute (cosmos-rl's param_dtype)
    c.train.optm_weight_decay = 0.01
    c.train.optm_eps = 1e-6
    c.train.optm_warmup_steps = 20
    c.train.lr_schedule = "constant"  # released: no decay after warm-up
    c.train.optm_grad_norm_clip = 1.0  # released value
    c.train.train_policy.dataset.layout = "conversations"
    c.policy.family = "qwen3_vl"
    # wfm_jax's layout (cosmos-rl shards with FSDP too): weights and AdamW state split over every
    # device, each decoder block recomputed in the backward pass (docs/sharding_and_memory.md)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.policy.remat = "nothing_saveable"
    c.policy.model_name_or_path = "./checkpoints/Cosmos-Reason2-2B"
    c.policy.lora.target_modules = QWEN3_VL_LORA_TARGETS  # used with --config.policy.lora.enable=True
    v = c.policy.vlm
    v.train_vision = True  # released: a full fine-tune, vision tower included
    v.system_prompt = ""  # released: no system turn
    v.pad_to_multiple = 64
    v.max_new_tokens = 256  # validation's greedy answers
    return c
