"""AdaLN-style modulation shared by the DiTs (SD3, Wan): fp32 norm, scale / shift and gated sums.

Modulation vectors are fp32 (B, D); the results come back in the compute dtype.
"""
from __future__ import annotations

import jax.numpy as jnp

from wfm_jax.models.layers.norms import LayerNorm


def modulate(norm: LayerNorm, x, shift, scale, dtype):
    """norm(x) * (1 + scale) + shift in fp32, returned in the compute dtype."""
    y = norm(x.astype(jnp.float32))
    return (y * (1.0 + scale[:, None]) + shift[:, None]).astype(dtype)


def gated_residual(x, gate, y):
    """x + gate * y with the sum taken in fp32 (gate is fp32 modulation)."""
    return (x.astype(jnp.float32) + gate[:, None] * y.astype(jnp.float32)).astype(x.dtype)
