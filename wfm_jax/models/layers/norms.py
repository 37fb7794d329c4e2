"""Normalisations computed in fp32 whatever the compute dtype (design rule: norms stay fp32)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import param


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm over the last axis; `affine=False` matches elementwise_affine=False."""

    def __init__(self, dim: int, *, eps: float = 1e-6, affine: bool = True, bias: bool = True,
                 param_dtype=jnp.float32, axes=("embed",)):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), axes) if affine else None
        self.bias = param(jnp.zeros((dim,), param_dtype), axes) if affine and bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps)
        if self.scale is not None:
            y = y * self.scale[...].astype(jnp.float32)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        return y.astype(dtype)


class RMSNorm(nnx.Module):
    """diffusers RMSNorm (weight optional), computed in fp32."""

    def __init__(self, dim: int, *, eps: float = 1e-6, affine: bool = True,
                 param_dtype=jnp.float32, axes=(None,)):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), axes) if affine else None

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        if self.scale is not None:
            y = y * self.scale[...].astype(jnp.float32)
        return y.astype(dtype)
