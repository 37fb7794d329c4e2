"""Shared machinery of the SANA1.5 and SANA-Video transformer tests: tiny random diffusers models
with every weight re-drawn (norm weights near 1, the rest near 0, so a swapped mapping shows),
converted through the table into the wfm_jax model, and the jitted forward."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from flax import nnx
from safetensors import safe_open

from converters.table import convert_to_jax
from wfm_jax.core.tree import flat_params, flat_shapes

ATOL = 2e-5
BF16_REL_TOL = 2e-2
TEXT_LEN = 7
TIMESTEPS = np.array([999, 517], np.int64)  # what the pipelines feed: int64 ~ 1000 sigma
# right-padded Gemma masks of different lengths (padding_side="right")
MASK = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]], np.int64)


def randomise(model, scale: float = 0.1):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            base = 1.0 if p.ndim == 1 and bool((p == 1).all()) else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model


def numpy_state(model, dtype=torch.float32):
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(dtype).contiguous()
        out[k] = (v.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16
                  else v.numpy())
    return out


def torch_state(tensors, dtype: str):
    return {k: (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
                if dtype == "bfloat16" else torch.from_numpy(v.copy())) for k, v in tensors.items()}


def loaders(tensors):
    return {k: (lambda v=v: v) for k, v in tensors.items()}


def jax_model(make_model, build_table, config, tensors, *, dtype=None, param_dtype=jnp.float32,
              **options):
    model = nnx.eval_shape(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0), **options))
    flat = convert_to_jax(build_table(config), loaders(tensors), flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], param_dtype))
    return model


def jit_forward(model):
    """Keyword call as the diffusers forward; returns numpy."""
    graph, state = nnx.split(model)
    fn = jax.jit(lambda s, kw: nnx.merge(graph, s)(**kw))
    return lambda **kw: np.asarray(fn(state, kw))


def torch_forward(model, inputs: dict):
    kw = {k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}
    with torch.no_grad():
        return model(**kw, return_dict=False)[0].float().numpy()


def raw_safetensors(directory):
    out = {}
    with safe_open(os.path.join(directory, "diffusion_pytorch_model.safetensors"), "numpy") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            out[key] = (piece.get_dtype(), tuple(piece.get_shape()), f.get_tensor(key).tobytes())
    return out


def eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from eqns(sub)
