"""Wan's 3D rotary position embedding (diffusers `WanRotaryPosEmbed`), interleaved pairs.

The head dim splits into frame / height / width parts (h = w = 2 * (head_dim // 6), t = the
rest); each part rotates pairs (x[2i], x[2i+1]) by position * theta^(-2i / part). The angle
tables are computed on the host in float64 and rounded once to float32, as diffusers does
(`get_1d_rotary_pos_embed(..., freqs_dtype=float64)` then `.float()`), so they carry no
accumulated fp32 error.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """(t, h, w) widths of the head dim that each rotate with one grid axis."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def _angles(dim: int, n: int, theta: float) -> np.ndarray:
    """(n, dim // 2) float64 angles position * theta^(-2i / dim)."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    return np.outer(np.arange(n, dtype=np.float64), freqs)


def rope_tables(head_dim: int, grid: tuple[int, int, int], max_seq_len: int = 1024,
                theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape (F * H * W, head_dim // 2) float32 for a (F, H, W) patch grid, tokens
    row-major over (f, h, w) like the patch embedding's flatten."""
    if max(grid) > max_seq_len:
        raise ValueError(f"patch grid {grid} exceeds rope_max_seq_len={max_seq_len}")
    f, h, w = grid
    dt, dh, dw = axis_dims(head_dim)
    at, ah, aw = _angles(dt, f, theta), _angles(dh, h, theta), _angles(dw, w, theta)
    full = np.concatenate([
        np.broadcast_to(at[:, None, None], (f, h, w, at.shape[1])),
        np.broadcast_to(ah[None, :, None], (f, h, w, ah.shape[1])),
        np.broadcast_to(aw[None, None, :], (f, h, w, aw.shape[1])),
    ], axis=-1).reshape(f * h * w, head_dim // 2)
    return np.cos(full).astype(np.float32), np.sin(full).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate interleaved pairs of x (B, S, N, head_dim) in fp32; returns x's dtype."""
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)
