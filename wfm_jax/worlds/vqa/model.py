"""The VQA world's base model: a tiny random Qwen3-VL whose tokenizer keeps the world's words whole."""
from __future__ import annotations

from wfm_jax.families.qwen3_vl.tiny import ensure_tiny_qwen3_vl
from wfm_jax.worlds.vqa.scenes import vocabulary


def ensure_base_model(directory: str, seed: int = 0, size: str = "vqa") -> str:
    """Build the model directory unless it exists (families.qwen3_vl.tiny for what it holds)."""
    return ensure_tiny_qwen3_vl(directory, vocabulary(), seed=seed, size=size)
