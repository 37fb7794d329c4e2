"""Flat views of an NNX model's parameters: dotted path -> array (the converters' key space)."""
from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx


def path_str(path) -> str:
    return ".".join(str(p) for p in path)


def flat_params(model: nnx.Module, filter=nnx.Param) -> dict[str, nnx.Variable]:
    """dotted path -> Variable (abstract or concrete) for every variable matching `filter`.

    LoRA parameters are excluded by default (LoRAParam is a Param subclass).
    """
    out = {}
    for path, var in nnx.state(model, filter).flat_state():
        if filter is nnx.Param and isinstance(var, nnx.LoRAParam):
            continue
        out[path_str(path)] = var
    return out


def flat_shapes(model: nnx.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in flat_params(model).items()}


def flat_arrays(model: nnx.Module) -> dict[str, np.ndarray]:
    """Host copies of the base parameters (dtype kept)."""
    return {k: np.asarray(jax.device_get(v[...])) for k, v in flat_params(model).items()}


def assign(model: nnx.Module, flat: Mapping[str, Any]) -> None:
    """Set base parameters from dotted path -> array; every parameter must be given exactly once."""
    params = flat_params(model)
    missing = set(params) - set(flat)
    extra = set(flat) - set(params)
    if missing or extra:
        raise KeyError(f"parameter mismatch: missing {sorted(missing)[:8]}, extra {sorted(extra)[:8]}")
    for key, var in params.items():
        value = flat[key]
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{key}: shape {tuple(value.shape)} != model {tuple(var.shape)}")
        var[...] = value
