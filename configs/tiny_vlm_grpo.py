"""GRPO of the tiny Qwen3-VL-shaped model on the tiny VQA world (wfm_jax.worlds.vqa), cosmos-rl's
GRPO for language models (specs/reason2.md §4.2): 40 steps of 4 prompts x 8 completions, rewards
format + single_choice (the record's answer letter as the reference), val/accuracy on the held-out
split before the first step and after the last.

    python -m wfm_jax.main --config configs/tiny_vlm_grpo.py

Start: the newest export of the SFT recipe (configs/tiny_vlm_sft.py: ./outputs/tiny_vlm_sft/
safetensors/step_N) when one exists, else the base model that recipe builds (pre-trained to describe
pictures, never asked a question: the format reward is ~0 everywhere, every group has advantage 0
and nothing trains, so run the SFT recipe first). The resolved start is in the run's config.json
(policy.model_name_or_path). The world's SFT answers think two ways (policy.vlm.
vqa_fixed_think_fraction 0.5): half name the cell they read ("look"), half say "I look at the
image." ("fixed"); the SFT model samples both and reads colour better after naming the cell, so
GRPO has a better way of answering to find. From the SFT recipe's export (seed 0, 0.740 held-out),
40 steps raised held-out accuracy by +0.146 / +0.146 / +0.135 on GRPO seeds 0-2, the format reward
at 0.993-1.00 (greedy answers move to the look style); from SFT seeds 1 and 2, +0.062 to +0.094
(docs/reason2_post_training.md, session 38). About 40 s alone on 2 cores, start-up included.
lm_grpo.variant "grpo" trains every group, "dapo" refills the step with groups whose
filter_reward_metric rewards differ.
"""
import glob
import os
import re

from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS, default_config

SFT_EXPORTS = "./outputs/tiny_vlm_sft/safetensors"
BASE_MODEL = "./outputs/tiny_vqa_look/base_model"


def sft_start() -> str:
    """The SFT recipe's newest export, else the base model path (built on first use)."""
    steps = [(int(m.group(1)), d) for d in glob.glob(os.path.join(SFT_EXPORTS, "step_*"))
             if (m := re.fullmatch(r"step_(\d+)", os.path.basename(d)))
             and os.path.isfile(os.path.join(d, "config.json"))]
    return max(steps)[1] if steps else BASE_MODEL


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_vlm_grpo"
    # 40: at 20 one seed of three had moved only a quarter of its answers to the look style
    # (+0.021 held-out); at 40 every run had moved most (docs/reason2_post_training.md)
    c.train.max_steps = 40
    c.train.seed = 0
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 32  # 4 prompts x rollout.n_generation
    c.rollout.n_generation = 8
    c.train.optm_lr = 1e-4
    c.train.optm_weight_decay = 0.0
    c.train.ckpt.save_freq = 5
    c.train.ckpt.max_keep = 2
    tp = c.train.train_policy
    tp.type = "grpo"
    tp.mini_batch = 8
    g = tp.lm_grpo
    g.max_response_length = 24
    tp.dataset.layout = "conversations"
    # the SFT recipe's world: options in a fixed order per question type (policy.vlm.vqa_options)
    tp.dataset.local_dir = "./outputs/tiny_vqa_mixed/train"
    c.validation.dataset.local_dir = "./outputs/tiny_vqa_mixed/heldout"
    c.validation.batch_size = 64
    c.policy.family = "qwen3_vl"
    # four decoder layers: unrolled, the SFT step runs about 1.7x faster on 2 CPU cores than as one
    # lax.scan (XLA:CPU copies each layer's saved activations transposed in the scanned backward)
    c.policy.scan_layers = False
    c.policy.model_name_or_path = sft_start()
    c.policy.lora.target_modules = QWEN3_VL_LORA_TARGETS  # used with --config.policy.lora.enable=True
    v = c.policy.vlm
    v.build_tiny_vqa = True  # the data sets (and the base model when no SFT export exists)
    v.train_vision = False  # as the SFT recipe
    v.model_max_length = 512
    v.pad_to_multiple = 64  # VQA prompts pad to one length: one update program
    v.max_new_tokens = 24
    v.vqa_train_count = 1024
    v.vqa_val_count = 96
    v.vqa_options = "fixed"
    # mixed reasoning: half the answers think "I look at the image." instead of naming the cell
    v.vqa_fixed_think_fraction = 0.5
    return c
