"""The VQA world's base model: a tiny Qwen3-VL whose tokenizer keeps the world's words whole.

Built in two stages (train.vlm_sft.build_tiny_assets): the random model (`ensure_base_model`,
families.qwen3_vl.tiny, size "vqa"), then `policy.vlm.vqa_pretrain_steps` of SFT on describing
training pictures (dataset.build_description_dataset), as a VLM's pre-training precedes its
instruction tuning. Both stages work in `pretrain_dir(base)`, a sibling of the base dir, whose
result is renamed into place: a base dir that exists is always finished.
"""
from __future__ import annotations

import os

from wfm_jax.families.qwen3_vl.tiny import ensure_tiny_qwen3_vl
from wfm_jax.worlds.vqa.scenes import vocabulary


def ensure_base_model(directory: str, seed: int = 0, size: str = "vqa") -> str:
    """Build the random model directory unless it exists (families.qwen3_vl.tiny for what it holds)."""
    return ensure_tiny_qwen3_vl(directory, vocabulary(), seed=seed, size=size)


def pretrain_dir(base: str) -> str:
    """Where the base model at `base` is built: DIR.pretrain/{random,describe,run}."""
    return os.path.abspath(base).rstrip(os.sep) + ".pretrain"


def ensure_random_model(base: str, seed: int = 0) -> str:
    """The random first stage of the base model at `base` (its shapes are the base's)."""
    return ensure_base_model(os.path.join(pretrain_dir(base), "random"), seed=seed)
