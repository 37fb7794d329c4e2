"""AdaLN-style modulation shared by the DiTs (SD3, Wan): fp32 norm, scale / shift and gated sums.

Modulation vectors are fp32 (B, D); the results come back in the compute dtype. Each helper is
one jax.checkpoint keeping its inputs (and the norm's per-row statistics): its fp32
intermediates are recomputed in the backward, not stored (layers/norms.py says why, and how a
model turns them off).
"""
from __future__ import annotations

import jax.numpy as jnp

from wfm_jax.models.layers.norms import LayerNorm, layer_norm_f32, norm_checkpointed


@norm_checkpointed(static_argnums=(5, 6))
def _modulate(x, w, b, shift, scale, eps, dtype):
    y = layer_norm_f32(x.astype(jnp.float32), w, b, eps)
    return (y * (1.0 + scale[:, None]) + shift[:, None]).astype(dtype)


def modulate(norm: LayerNorm, x, shift, scale, dtype):
    """norm(x) * (1 + scale) + shift in fp32, returned in the compute dtype."""
    return _modulate(x, *norm.params(), shift, scale, norm.eps, jnp.dtype(dtype))


@norm_checkpointed()  # no statistics here: keeps inputs
def gated_residual(x, gate, y):
    """x + gate * y with the sum taken in fp32 (gate is fp32 modulation)."""
    return (x.astype(jnp.float32) + gate[:, None] * y.astype(jnp.float32)).astype(x.dtype)
