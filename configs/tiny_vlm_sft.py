"""SFT of a tiny Qwen3-VL-shaped model on the tiny VQA world (wfm_jax.worlds.vqa): held-out
accuracy from 0.0 (the base model has never seen a question) to 0.906-0.948 (seeds 0-3, the test
suite's XLA flags, one shared base; colour 0.94-1.0) in about 3 min on 2 CPU cores, after the
base's one-time pre-training (about 4 min; docs/reason2_post_training.md).
The base model is the tiny random Qwen3-VL pre-trained once to describe training pictures
(policy.vlm.vqa_pretrain_steps, about 4 min, cached). The answers think "<what to look at>
<answer>" first (policy.vlm.vqa_target "look"); the options come in one fixed order per question
type (policy.vlm.vqa_options): with shuffled options the tiny model never learns to copy the
matching option's letter. The vision tower stays frozen: trained, it collapses to the background
colour before the decoder learns to read the cells.

    python -m wfm_jax.main --config configs/tiny_vlm_sft.py

The model (policy.model_name_or_path), the training conversations and the held-out ones are
built on first use and reused after (policy.vlm.build_tiny_vqa). metrics.jsonl gets val/accuracy
before the first step (step 0) and with the last; the trained model is exported to
output_dir/safetensors/step_N in transformers' layout.
"""
from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS, default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_vlm_sft"
    # 800, not 500: the colour lookup moves from describing to answering late, and where 500
    # steps end on that slope depended on the host's rounding (colour 0.56-1.0; 0.94-1.0 at 800)
    c.train.max_steps = 800
    c.train.seed = 0
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 16
    c.train.optm_lr = 3e-3
    c.train.lr_schedule = "cosine"  # the decay settles the noisy end (0.61 -> 0.67 held-out, seed 0)
    c.train.optm_weight_decay = 0.01
    c.train.optm_warmup_steps = 20
    c.train.ckpt.save_freq = 100
    c.train.ckpt.max_keep = 2
    ds = c.train.train_policy.dataset
    ds.layout = "conversations"
    ds.local_dir = "./outputs/tiny_vqa_look/train"
    c.validation.dataset.local_dir = "./outputs/tiny_vqa_look/heldout"
    c.validation.batch_size = 64
    c.policy.family = "qwen3_vl"
    c.policy.model_name_or_path = "./outputs/tiny_vqa_look/base_model"
    c.policy.lora.target_modules = QWEN3_VL_LORA_TARGETS  # used with --config.policy.lora.enable=True
    v = c.policy.vlm
    v.build_tiny_vqa = True
    v.train_vision = False
    v.model_max_length = 512
    v.pad_to_multiple = 80  # every VQA conversation (64-68 tokens) pads to 80: one program
    v.max_new_tokens = 24
    v.vqa_train_count = 1024
    v.vqa_val_count = 96
    v.vqa_options = "fixed"
    return c
