"""Normalisations computed in fp32 whatever the compute dtype (design rule: norms stay fp32).

Each is one jax.checkpoint that keeps only its inputs and its per-row statistics (NORM_STATS)
for the backward: autodiff of the fp32 body would store three activation-sized fp32 arrays per
call (the upcast input, the centred input, the normalised output), twice the bytes of the bf16
activation itself, where recomputing them from that input is a few element-wise operations
fused into the backward. On the SD3.5-M step this was the largest share of what the layer scan
stores (docs/bench_notes.md, "gpu 2026-12-04 H200").

The checkpoints are on unless the model is traced inside `norm_checkpoints(False)` (each DiT's
`norm_checkpoints` option, `policy.norm_checkpoints`): the same numbers either way, but what the
TPU compiler makes of them differs by program. On the v5p plans they saved 21 GB a chip on
Cosmos-Predict2.5-2B DDRL's update, and cost SD3.5-M GRPO's update 4.9% of its estimated time
and SD3.5-M NFT's 2.7 GB and 1.4% (docs/recipe_targets.md, session 50).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wfm_jax.models.layers.linear import param

NORM_STATS = "norm_statistics"  # per-row mean / reciprocal std, (..., 1) fp32: kept
# the policy of every such layer-internal checkpoint (norms, layers/modulation.py), which is how
# a jaxpr tells them from the per-block remat of layers/remat.py
KEEP_NORM_STATS = jax.checkpoint_policies.save_only_these_names(NORM_STATS)
# read when a norm is traced: set by a model's forward for its whole trace (norm_checkpoints)
_CHECKPOINTS = contextvars.ContextVar("wfm_jax_norm_checkpoints", default=True)


@contextlib.contextmanager
def norm_checkpoints(enabled: bool):
    """Trace the norms and modulation helpers inside the block with (True, the default) or
    without (False) their checkpoints."""
    token = _CHECKPOINTS.set(bool(enabled))
    try:
        yield
    finally:
        _CHECKPOINTS.reset(token)


def norm_checkpointed(static_argnums: tuple[int, ...] = ()):
    """Decorator: fn as one jax.checkpoint keeping its inputs and NORM_STATS, or fn itself
    where traced inside norm_checkpoints(False)."""
    def wrap(fn):
        checkpoint = jax.checkpoint(fn, policy=KEEP_NORM_STATS, static_argnums=static_argnums)

        @functools.wraps(fn)
        def call(*args):
            return checkpoint(*args) if _CHECKPOINTS.get() else fn(*args)
        return call
    return wrap


def layer_norm_f32(x, scale, bias, eps: float):
    """torch.nn.LayerNorm's arithmetic over the last axis of fp32 `x`; scale / bias optional."""
    mean = checkpoint_name(jnp.mean(x, axis=-1, keepdims=True), NORM_STATS)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * checkpoint_name(jax.lax.rsqrt(var + eps), NORM_STATS)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y


@norm_checkpointed(static_argnums=(3,))
def _layer_norm(x, scale, bias, eps):
    return layer_norm_f32(x.astype(jnp.float32), scale, bias, eps).astype(x.dtype)


@norm_checkpointed(static_argnums=(2,))
def _rms_norm(x, scale, eps):
    f = x.astype(jnp.float32)
    y = f * checkpoint_name(jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps),
                            NORM_STATS)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    return y.astype(x.dtype)


def traced_with_norm_checkpoints(forward):
    """A model's forward method traced inside norm_checkpoints(self.norm_checkpoints)."""
    @functools.wraps(forward)
    def call(self, *args, **kwargs):
        with norm_checkpoints(self.norm_checkpoints):
            return forward(self, *args, **kwargs)
    return call


def _value(p):
    return None if p is None else p[...]


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm over the last axis; `affine=False` matches elementwise_affine=False."""

    def __init__(self, dim: int, *, eps: float = 1e-6, affine: bool = True, bias: bool = True,
                 param_dtype=jnp.float32, axes=("embed",)):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), axes) if affine else None
        self.bias = param(jnp.zeros((dim,), param_dtype), axes) if affine and bias else None

    def params(self) -> tuple:
        """(scale, bias) arrays, None where absent (for fused callers: layers/modulation.py)."""
        return _value(self.scale), _value(self.bias)

    def __call__(self, x: jax.Array) -> jax.Array:
        return _layer_norm(x, *self.params(), self.eps)


class RMSNorm(nnx.Module):
    """diffusers RMSNorm (weight optional), computed in fp32."""

    def __init__(self, dim: int, *, eps: float = 1e-6, affine: bool = True,
                 param_dtype=jnp.float32, axes=(None,)):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), axes) if affine else None

    def __call__(self, x: jax.Array) -> jax.Array:
        return _rms_norm(x, _value(self.scale), self.eps)
