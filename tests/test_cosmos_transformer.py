"""Cosmos-Predict2.5 DiT (CosmosTransformer3DModel): forward parity with diffusers, the converter
table both ways (in memory and through `python -m converters`), remat, sharding and the released
configs.

Tiny random diffusers models with every weight re-drawn (norm weights too, so a swapped mapping
shows) go through the converter into the wfm_jax model; the forward must match torch in fp32 to
2e-5. Variants (the tiny config of spec video_models.md §4.1, batch 2, non-square grid):
  proj:       crossattn_proj on, one sigma per sample, a nonzero condition mask, zero padding mask
  frames:     no crossattn_proj, per-frame sigmas [B, 1, T, 1, 1] (first frame conditioned at
              1e-4), a random padding mask resized from an odd size, fps set
  p222:       patch (2, 2, 2) (temporal patching and the odd unpatchify order), out_channels 3,
              rope_scale (2, 1, 1), one sigma shared by the batch ([1])
diffusers' padding-mask resize needs torchvision, which is not installed: its tensor
resize(NEAREST) is F.interpolate(mode="nearest"), shimmed exactly as spec §4.1 says.
"""
from __future__ import annotations

import functools
import json
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import CosmosTransformer3DModel
from diffusers.models.transformers import transformer_cosmos
from flax import nnx
from safetensors import safe_open

from converters import jax_state
from converters.cli import main as converters_main
from converters.cosmos_transformer import build_table, make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.models.cosmos import COSMOS25_PREDICT_2B, COSMOS25_PREDICT_14B, CosmosTransformer
from wfm_jax.models.cosmos.embeddings import resize_nearest
from wfm_jax.models.cosmos.rope import rope_tables
from wfm_jax.models.layers.remat import REMAT_POLICIES
from wfm_jax.models.loading import check_against_model
from wfm_jax.models.state import flat_arrays, flat_params, flat_shapes

transformer_cosmos.transforms = SimpleNamespace(
    functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                               F.interpolate(img, size=size, mode="nearest")),
    InterpolationMode=SimpleNamespace(NEAREST="nearest"))

BASE = dict(in_channels=4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=12,
            num_layers=2, mlp_ratio=2.0, text_embed_dim=16, adaln_lora_dim=8, max_size=(8, 32, 32),
            patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0), concat_padding_mask=True,
            extra_pos_embed_type=None, use_crossattn_projection=True,
            crossattn_proj_in_channels=32, encoder_hidden_states_channels=16)
VARIANTS = {
    "proj": {},
    "frames": dict(use_crossattn_projection=False),
    "p222": dict(patch_size=(2, 2, 2), out_channels=3, rope_scale=(2.0, 1.0, 1.0)),
}
SHAPE = (2, 4, 4, 8, 6)  # (B, C, T, H, W): grid (4|2, 4, 3), non-square
TEXT_LEN = 7
ATOL = 2e-5
BF16_REL_TOL = 2e-2  # as the SD3 / Wan tests


def _torch_model(variant: str):
    config = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    model = CosmosTransformer3DModel(**config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # norm weights stay near 1, everything else near 0
            base = 1.0 if p.ndim == 1 and bool((p == 1).all()) else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return config, model


def _numpy_state(model, dtype=torch.float32):
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(dtype).contiguous()
        out[k] = (v.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16
                  else v.numpy())
    return out


def _loaders(tensors):
    return {k: (lambda v=v: v) for k, v in tensors.items()}


def _jax_model(config, tensors, *, dtype=None, param_dtype=jnp.float32, **options):
    model = nnx.eval_shape(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0), **options))
    flat = convert_to_jax(build_table(config), _loaders(tensors), flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], param_dtype))
    return model


def _inputs(variant: str, config: dict):
    """(positional args, keyword args) as numpy, the diffusers forward's layout."""
    rng = np.random.default_rng(0)
    b, c, t, h, w = SHAPE
    x = rng.standard_normal((b, c, t, h, w), np.float32)
    text_dim = (config["crossattn_proj_in_channels"] if config["use_crossattn_projection"]
                else config["text_embed_dim"])
    text = rng.standard_normal((b, TEXT_LEN, text_dim), np.float32)
    cond = np.zeros((b, 1, t, h, w), np.float32)
    cond[:, :, :1] = 1.0  # the first latent frame is a conditioning frame
    kwargs = dict(condition_mask=cond, padding_mask=np.zeros((1, 1, 64, 64), np.float32))
    if variant == "frames":
        sigma = np.full((b, 1, t, 1, 1), 0.7, np.float32)
        sigma[:, :, 0] = 1e-4
        sigma[1] *= 0.5
        kwargs["padding_mask"] = (rng.random((1, 1, 13, 11)) > 0.5).astype(np.float32)
        kwargs["fps"] = 16
    elif variant == "p222":
        sigma = np.array([0.35], np.float32)
    else:
        sigma = np.array([0.9, 0.25], np.float32)
    return (x, sigma, text), kwargs


def _jit_forward(model):
    graph, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("fps",))
    def fn(s, x, t, text, condition_mask, padding_mask, fps=None):
        return nnx.merge(graph, s)(x, t, text, condition_mask=condition_mask,
                                   padding_mask=padding_mask, fps=fps)

    return lambda *a, **k: np.asarray(fn(state, *a, **k))


def _torch_args(args, kwargs):
    t = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a
    return [t(a) for a in args], {k: t(v) for k, v in kwargs.items()}


@functools.lru_cache(maxsize=None)
def _case(variant: str) -> dict:
    config, torch_model = _torch_model(variant)
    args, kwargs = _inputs(variant, config)
    targs, tkwargs = _torch_args(args, kwargs)
    with torch.no_grad():
        want = torch_model(*targs, **tkwargs, return_dict=False)[0].numpy()
    return dict(variant=variant, config=config, torch_model=torch_model,
                tensors=_numpy_state(torch_model), args=args, kwargs=kwargs, want=want)


@pytest.fixture(params=list(VARIANTS))
def case(request):
    return _case(request.param)


def test_forward_matches_diffusers_fp32(case):
    got = _jit_forward(_jax_model(case["config"], case["tensors"]))(*case["args"],
                                                                     **case["kwargs"])
    assert got.shape == case["want"].shape
    err = float(np.max(np.abs(got - case["want"])))
    print(f"cosmos transformer {case['variant']} fp32 max abs err {err:.3g}")
    assert err <= ATOL, f"{case['variant']}: max abs diff {err:.3g}"
