"""A tiny random diffusers SD3Transformer2DModel on disk (fp32 or bf16) for loader/CLI tests."""
from __future__ import annotations

import json
import os

import numpy as np

# MMDiT-X flavour (dual attention in block 0, qk rms-norm) so the table's optional keys are on
# disk too; 4 heads and width 32 divide a (data=2, fsdp=2, context=2) mesh.
CONFIG = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
              num_attention_heads=4, joint_attention_dim=16, caption_projection_dim=32,
              pooled_projection_dim=8, out_channels=4, pos_embed_max_size=24,
              dual_attention_layers=(0,), qk_norm="rms_norm")


def torch_model(seed: int = 0):
    import torch
    from diffusers import SD3Transformer2DModel
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(**CONFIG).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # diffusers zero-inits the adaLN/output layers: redraw every weight
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def save(model, directory: str, dtype: str = "float32") -> str:
    import copy

    import torch
    if dtype != "float32":
        model = copy.deepcopy(model).to(getattr(torch, dtype))
    model.save_pretrained(directory, safe_serialization=True)
    return str(directory)


def as_pipeline(transformer_dir: str, pipeline_dir: str) -> str:
    """A pipeline-shaped dir: model_index.json + transformer/ (the other components are absent)."""
    os.makedirs(pipeline_dir, exist_ok=True)
    os.symlink(os.path.abspath(transformer_dir), os.path.join(pipeline_dir, "transformer"))
    with open(os.path.join(pipeline_dir, "model_index.json"), "w") as f:
        json.dump({"_class_name": "StableDiffusion3Pipeline",
                   "transformer": ["diffusers", "SD3Transformer2DModel"]}, f)
    return str(pipeline_dir)


def inputs(batch: int = 4, height: int = 8, width: int = 12, text_len: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, CONFIG["in_channels"], height, width), np.float32),
            rng.standard_normal((batch, text_len, CONFIG["joint_attention_dim"]), np.float32),
            rng.standard_normal((batch, CONFIG["pooled_projection_dim"]), np.float32),
            np.linspace(3.5, 950.25, batch).astype(np.float32))
