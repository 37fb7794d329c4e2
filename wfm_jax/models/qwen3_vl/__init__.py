"""Qwen3-VL (Cosmos-Reason2) in Flax NNX: vision tower, DeepStack, interleaved M-RoPE decoder."""
from wfm_jax.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from wfm_jax.models.qwen3_vl.model import Qwen3VLForConditionalGeneration, init_cache, make_model
from wfm_jax.models.qwen3_vl.rope_index import get_rope_index, position_ids

__all__ = ["Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "TextConfig", "VisionConfig",
           "get_rope_index", "init_cache", "make_model", "position_ids"]
