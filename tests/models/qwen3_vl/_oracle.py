"""The tiny Qwen3-VL of specs/reason2.md §3, the transformers oracle with random weights, the same
weights in the Flax model, and inputs built directly (no image processor)."""
from __future__ import annotations

import copy

import numpy as np
from flax import nnx

from converters.qwen3_vl import load_tensors
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration

IMAGE, VIDEO, VSTART, VEND, EOS = 5, 6, 3, 4, 2
TINY = {
    "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VSTART,
    "vision_end_token_id": VEND, "tie_word_embeddings": True,
    "text_config": {
        "model_type": "qwen3_vl_text", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "attention_bias": False,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                            "mrope_section": [4, 2, 2], "mrope_interleaved": True},
        "bos_token_id": 0, "eos_token_id": EOS, "pad_token_id": 0},
    "vision_config": {
        "model_type": "qwen3_vl_vision", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
        "num_heads": 2, "in_channels": 3, "patch_size": 16, "temporal_patch_size": 2,
        "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0, 1], "hidden_act": "gelu_pytorch_tanh"},
}


def tiny_config(**changes) -> dict:
    cfg = copy.deepcopy(TINY)
    for key, value in changes.items():
        cfg[key] = value
    return cfg


def torch_model(config: dict | None = None, seed: int = 0):
    """The transformers model with every tensor random (norm weights near 1), fp32, eager."""
    import torch
    from transformers import Qwen3VLConfig
    from transformers import Qwen3VLForConditionalGeneration as Torch

    torch.manual_seed(seed)
    model = Torch(Qwen3VLConfig(**(config or TINY)))
    model.config._attn_implementation = "eager"
    for sub in (model.config.text_config, model.config.vision_config):
        sub._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            is_norm = "norm" in name and name.endswith("weight")
            p.copy_(1.0 + 0.1 * noise if is_norm else 0.1 * noise)
    return model.eval()


def tensors_of(torch_model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in torch_model.state_dict().items()}


def flax_model(torch_model, **options) -> Qwen3VLForConditionalGeneration:
    config = torch_model.config.to_dict()
    # abstract first: no initialiser runs (eager init costs more than the tests themselves)
    model = abstract_module(lambda: Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0),
                                                                   **options))
    load_tensors(model, tensors_of(torch_model))
    return model


def pixels(grid_thw, seed: int) -> np.ndarray:
    """Random patchified pixel values for the grids, (N, 3*2*16*16) fp32."""
    n = int(sum(t * h * w for t, h, w in grid_thw))
    return np.random.default_rng(seed).standard_normal((n, 3 * 2 * 16 * 16)).astype(np.float32)


def visual_run(kind: int, grid, merge: int = 2) -> list[int]:
    """<vision_start> pads <vision_end> for one image (kind IMAGE) or per frame group of a
    video (kind VIDEO, a text timestamp token before each group)."""
    t, h, w = grid
    per = (h // merge) * (w // merge)
    if kind == IMAGE:
        return [VSTART] + [IMAGE] * per + [VEND]
    out = []
    for k in range(t):
        out += [100 + k, VSTART] + [VIDEO] * per + [VEND]
    return out


def left_pad(rows: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n = max(len(r) for r in rows)
    ids = np.array([[pad] * (n - len(r)) + r for r in rows], np.int64)
    mask = np.array([[0] * (n - len(r)) + [1] * len(r) for r in rows], np.int64)
    return ids, mask
