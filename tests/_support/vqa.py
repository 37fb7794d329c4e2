"""The tiny VQA world the VLM trainer tests run on: a random tiny Qwen3-VL (the "spec" size) and
small train and held-out splits of colour and background questions, built under one folder."""
from __future__ import annotations

import os

from wfm_jax.families.qwen3_vl.tiny import ensure_tiny_qwen3_vl
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset
from wfm_jax.worlds.vqa.scenes import vocabulary

TYPES = ("colour", "background")


def tiny_vqa_assets(root: str, train_count: int, val_count: int = 4) -> tuple[str, str, str]:
    """(model dir, train split dir, held-out split dir) under `root`."""
    model = ensure_tiny_qwen3_vl(os.path.join(root, "model"), vocabulary(), size="spec")
    train = build_vqa_dataset(os.path.join(root, "train"), count=train_count, split="train", seed=1, types=TYPES)
    val = build_vqa_dataset(os.path.join(root, "val"), count=val_count, split="heldout", seed=1, types=TYPES)
    return model, train, val
