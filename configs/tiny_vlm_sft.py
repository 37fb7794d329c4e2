"""SFT of a tiny Qwen3-VL-shaped model on the tiny VQA world (wfm_jax.worlds.vqa): held-out
accuracy from 0.0 (the base model has never seen a question) to 0.740 / 0.844 / 0.833 (seeds 0-2),
1600 steps in 3m03s-3m16s alone on 2 CPU cores, after the base's one-time pre-training (about 2
min; docs/reason2_post_training.md, session 38).
The base model is the tiny random Qwen3-VL pre-trained once to describe training pictures
(policy.vlm.vqa_pretrain_steps, cached). The answers think in one of two ways, half each
(policy.vlm.vqa_fixed_think_fraction): "<what to look at> <answer>" first (policy.vlm.vqa_target
"look"), or the fixed "I look at the image.". The trained model samples both and reads the picture
better after naming the cell: configs/tiny_vlm_grpo.py then teaches it which way earns the reward.
The options come in one fixed order per question type (policy.vlm.vqa_options): with shuffled
options the tiny model never learns to copy the matching option's letter. The vision tower stays
frozen: trained, it collapses to the background colour before the decoder learns to read the cells.

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
    # 1600: half the answers look first, and the look-style colour reading is learned late (forced
    # look-style colour 0.62-0.84 at 800-1200 steps, 0.84-1.0 at 1600; all-look answers come out
    # 0.02-0.09 above greedy at 800, 0.08-0.13 at 1600: the room GRPO has)
    c.train.max_steps = 1600
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
    ds.local_dir = "./outputs/tiny_vqa_mixed/train"
    c.validation.dataset.local_dir = "./outputs/tiny_vqa_mixed/heldout"
    c.validation.batch_size = 64
    c.policy.family = "qwen3_vl"
    # four decoder layers: unrolled, the SFT step runs about 1.7x faster on 2 CPU cores than as one
    # lax.scan (XLA:CPU copies each layer's saved activations transposed in the scanned backward)
    c.policy.scan_layers = False
    c.policy.model_name_or_path = "./outputs/tiny_vqa_look/base_model"
    c.policy.lora.target_modules = QWEN3_VL_LORA_TARGETS  # used with --config.policy.lora.enable=True
    v = c.policy.vlm
    v.build_tiny_vqa = True
    v.train_vision = False
    v.model_max_length = 512
    # every VQA conversation (64-72 tokens) pads to 72: one program, and 10% fewer tokens than 80
    v.pad_to_multiple = 72
    v.max_new_tokens = 24
    v.vqa_train_count = 1024
    v.vqa_val_count = 96
    v.vqa_options = "fixed"
    # mixed reasoning: half the answers think "I look at the image." instead of naming the cell
    v.vqa_fixed_think_fraction = 0.5
    return c
