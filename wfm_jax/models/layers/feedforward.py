"""diffusers FeedForward with activation_fn="gelu-approximate" (SD3, Wan): net.0.proj, net.2."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import Linear


class _GELUProj(nnx.Module):
    """diffusers activations.GELU(approximate="tanh"): proj then tanh-GELU."""

    def __init__(self, dim: int, inner: int, **lin):
        self.proj = Linear(dim, inner, axes=("embed", "mlp"), **lin)

    def __call__(self, x):
        return jax.nn.gelu(self.proj(x), approximate=True)


class _Identity(nnx.Module):
    """Stands where diffusers keeps a Dropout(0.0), so ff.net indices match (net.0, net.2)."""

    def __call__(self, x):
        return x


class FeedForward(nnx.Module):
    """diffusers FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): hidden width
    `inner` (Wan's ffn_dim) or dim * mult (SD3: 4)."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32, mult=4,
                 inner: int | None = None):
        lin = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        inner = inner or dim * mult
        self.net = nnx.List([_GELUProj(dim, inner, **lin), _Identity(),
                             Linear(inner, dim, axes=("mlp", "embed"), **lin)])

    def __call__(self, x):
        for layer in self.net:
            x = layer(x)
        return x
