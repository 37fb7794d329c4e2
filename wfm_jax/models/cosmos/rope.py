"""Cosmos's 3D rotary position embedding (diffusers `CosmosRotaryPosEmbed`), rotate-half form.

The head dim splits into frame / height / width parts (h = w = 2 * (head_dim // 6), t = the
rest). Each part has its own NTK-scaled base theta = 1e4 * rope_scale ** (part / (part - 2))
(Cosmos-Predict2.5: 3 on h and w, 1 on t) and angles position * theta^(-2i / part). Unlike Wan
the halves are not interleaved: cos/sin are cat([t, h, w] * 2) and x rotates as
x * cos + cat(-x2, x1) * sin (diffusers `apply_rotary_emb(use_real_unbind_dim=-2)`).

diffusers builds these tables in float32 (not float64 as Wan does): frequencies, positions and
angles are float32 here too, with each step correctly rounded (float64 pow / cos / sin rounded
once), so the tables sit within an ulp or two of torch's float32 libm (max 1e-6 at angle ~100).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

BASE_FPS = 24  # diffusers CosmosRotaryPosEmbed(base_fps=24)


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """(t, h, w) widths of the head dim that each rotate with one grid axis."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def check_head_dim(head_dim: int) -> None:
    # diffusers divides by (part - 2): a part of width 2 (head_dim 6..11) is a ZeroDivisionError
    if head_dim % 2 or min(axis_dims(head_dim)) <= 2:
        raise ValueError(f"Cosmos RoPE needs an even attention_head_dim of at least 12 (each of "
                         f"its t/h/w parts wider than 2), got {head_dim}")


def _freqs(dim: int, scale: float) -> np.ndarray:
    """(dim // 2,) float32 theta^(-2i / dim) from float32 theta and exponents, as diffusers."""
    theta = np.float32(10000.0 * float(scale) ** (dim / (dim - 2)))
    exponent = np.arange(0, dim, 2, dtype=np.float32)[: dim // 2] / np.float32(dim)
    power = np.power(np.float64(theta), exponent.astype(np.float64)).astype(np.float32)
    return (np.float32(1.0) / power).astype(np.float32)


def rope_tables(head_dim: int, grid: tuple[int, int, int], max_positions: int,
                rope_scale=(1.0, 3.0, 3.0), fps: float | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape (F * H * W, head_dim // 2) float32 for a (F, H, W) patch grid, tokens
    row-major over (f, h, w). Each holds one half of diffusers' table (the two halves are equal).
    fps (None for images and in every diffusers pipeline) rescales frame positions by 24 / fps.
    max_positions: max(max_size // patch_size), the longest axis diffusers' table covers."""
    if max(grid) > max_positions:
        raise ValueError(f"patch grid {tuple(grid)} exceeds the RoPE table's {max_positions} "
                         "positions (config max_size // patch_size)")
    f, h, w = grid
    dt, dh, dw = axis_dims(head_dim)
    seq = np.arange(max_positions, dtype=np.float32)
    t_pos = seq[:f] if fps is None else seq[:f] / np.float32(fps) * np.float32(BASE_FPS)
    at = np.outer(t_pos, _freqs(dt, rope_scale[0]))
    ah = np.outer(seq[:h], _freqs(dh, rope_scale[1]))
    aw = np.outer(seq[:w], _freqs(dw, rope_scale[2]))
    full = np.concatenate([
        np.broadcast_to(at[:, None, None], (f, h, w, at.shape[1])),
        np.broadcast_to(ah[None, :, None], (f, h, w, ah.shape[1])),
        np.broadcast_to(aw[None, None, :], (f, h, w, aw.shape[1])),
    ], axis=-1).reshape(f * h * w, head_dim // 2).astype(np.float64)
    return np.cos(full).astype(np.float32), np.sin(full).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, *, heads_first: bool = False
               ) -> jax.Array:
    """Rotate-half RoPE on x (B, S, N, head_dim), or (B, N, S, head_dim) with `heads_first`, in
    fp32; returns x's dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = (cos[None, None], sin[None, None]) if heads_first else (cos[None, :, None, :], sin[None, :, None, :])
    out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    return out.astype(x.dtype)
