"""Patch, position, timestep and pooled-text embeddings as diffusers defines them.

Module and parameter names follow diffusers (`PatchEmbed.proj`, `TimestepEmbedding.linear_1`, ...),
so the converter tables stay one-to-one. Timestep embeddings are computed in fp32 whatever the
compute dtype: rounding a timestep to bf16 moves it by whole steps.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.models.layers.linear import Linear, param


class Buffer(nnx.Param):
    """A tensor diffusers keeps as a persistent buffer (e.g. SD3's cropped position table).

    It is a Param so it loads, saves and shards with the checkpoint like any weight, but it is not
    trained: the forward stops its gradient, and optimisers should leave it out
    (`wrt=nnx.All(nnx.Param, nnx.Not(Buffer))`) so weight decay does not touch it either.
    """


def timestep_embedding(t: jax.Array, dim: int, *, flip_sin_to_cos: bool = True,
                       downscale_freq_shift: float = 0.0, scale: float = 1.0,
                       max_period: float = 10000.0) -> jax.Array:
    """diffusers `get_timestep_embedding` for (B,) float timesteps -> (B, dim) fp32."""
    half = dim // 2
    exponent = -math.log(max_period) * np.arange(half, dtype=np.float64) / (half - downscale_freq_shift)
    freqs = jnp.asarray(np.exp(exponent).astype(np.float32))  # constants, correctly rounded
    args = scale * (t.astype(jnp.float32)[:, None] * freqs[None, :])
    emb = jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)
    if flip_sin_to_cos:
        emb = jnp.concatenate([emb[:, half:], emb[:, :half]], axis=-1)
    if dim % 2 == 1:
        emb = jnp.pad(emb, ((0, 0), (0, 1)))
    return emb


def _sincos_1d(dim: int, pos: np.ndarray) -> np.ndarray:
    omega = np.arange(dim // 2, dtype=np.float64) / (dim / 2.0)
    out = np.outer(pos.astype(np.float64), 1.0 / 10000 ** omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_2d_pos_embed(dim: int, grid_h: int, grid_w: int, *, base_size: int,
                        interpolation_scale: float = 1.0) -> np.ndarray:
    """diffusers `get_2d_sincos_pos_embed` -> (grid_h * grid_w, dim) fp32, row-major over (h, w).

    As in diffusers, the first half of each vector encodes the column (w) position and the second
    half the row (h) position; the grid is built in fp32 before the fp64 sin/cos.
    """
    if dim % 4:
        raise ValueError(f"2D sincos position embedding needs a width divisible by 4, got {dim}")

    def axis(n):
        return (np.arange(n, dtype=np.float32) / np.float32(n / base_size)
                / np.float32(interpolation_scale))

    # separable: a row's half depends on h alone, a column's on w alone, so each axis's sin/cos
    # is computed once and broadcast (SD3.5's 384 x 384 table: ~5 s -> well under 1 s)
    half = dim // 2
    cols = _sincos_1d(half, axis(grid_w)).astype(np.float32)  # (grid_w, half)
    rows = _sincos_1d(half, axis(grid_h)).astype(np.float32)  # (grid_h, half)
    emb = np.empty((grid_h, grid_w, dim), np.float32)
    emb[..., :half] = cols[None]
    emb[..., half:] = rows[:, None]
    return emb.reshape(grid_h * grid_w, dim)


class PatchEmbed(nnx.Module):
    """diffusers PatchEmbed (SD3 variant): stride-p conv as patchify + matmul, plus 2D sincos.

    With `pos_embed_max_size` the (max x max) table is a checkpoint tensor (`pos_embed.pos_embed`)
    and the forward centre-crops it to the input grid; without it the table is computed for the
    input grid at trace time (never stored), exactly as diffusers does.
    """

    def __init__(self, *, sample_size: int, patch_size: int, in_channels: int, embed_dim: int,
                 pos_embed_max_size: int | None, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32, interpolation_scale: float = 1.0):
        self.patch_size, self.embed_dim = patch_size, embed_dim
        self.pos_embed_max_size = pos_embed_max_size
        self.base_size = sample_size // patch_size
        self.interpolation_scale = interpolation_scale
        self.proj = _PatchProj(patch_size, in_channels, embed_dim, rngs=rngs, dtype=dtype,
                               param_dtype=param_dtype)
        if pos_embed_max_size:
            table = sincos_2d_pos_embed(embed_dim, pos_embed_max_size, pos_embed_max_size,
                                        base_size=self.base_size,
                                        interpolation_scale=interpolation_scale)
            self.pos_embed = param(jnp.asarray(table, param_dtype)[None], (None, None, "embed"), Buffer)
        else:
            self.pos_embed = None

    def _position_table(self, h: int, w: int) -> jax.Array:
        m = self.pos_embed_max_size
        if not m:
            return jnp.asarray(sincos_2d_pos_embed(self.embed_dim, h, w, base_size=self.base_size,
                                                   interpolation_scale=self.interpolation_scale))
        if h > m or w > m:
            raise ValueError(f"latent grid {h}x{w} patches exceeds pos_embed_max_size={m}")
        top, left = (m - h) // 2, (m - w) // 2
        table = jax.lax.stop_gradient(self.pos_embed[...]).reshape(m, m, self.embed_dim)
        return table[top:top + h, left:left + w].reshape(h * w, self.embed_dim)

    def __call__(self, x_nhwc: jax.Array) -> jax.Array:
        """(B, H, W, C) latents -> (B, H/p * W/p, D) tokens, row-major over the patch grid."""
        tokens, (h, w) = self.proj(x_nhwc)
        pos = self._position_table(h, w)
        # diffusers adds the fp32 table before casting back to the token dtype
        return (tokens.astype(jnp.float32) + pos[None].astype(jnp.float32)).astype(tokens.dtype)


class _PatchProj(nnx.Module):
    """Conv2d(kernel = stride = p) over non-overlapping patches, kernel stored HWIO."""

    def __init__(self, p: int, cin: int, cout: int, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.p, self.dtype = p, dtype
        fan_in = p * p * cin
        init = jax.random.normal(rngs.params(), (p, p, cin, cout), param_dtype) / math.sqrt(fan_in)
        self.kernel = param(init, (None, None, "conv_in", "embed"))
        self.bias = param(jnp.zeros((cout,), param_dtype), ("embed",))

    def __call__(self, x):
        b, hh, ww, c = x.shape
        p = self.p
        if hh % p or ww % p:
            raise ValueError(f"latent size {hh}x{ww} is not divisible by patch_size={p}")
        h, w = hh // p, ww // p
        dtype = self.dtype or x.dtype
        patches = x.astype(dtype).reshape(b, h, p, w, p, c)
        out = jnp.einsum("bhpwqc,pqcd->bhwd", patches, self.kernel[...].astype(dtype))
        out = out + self.bias[...].astype(dtype)
        return out.reshape(b, h * w, -1), (h, w)


class TimestepEmbedding(nnx.Module):
    """linear_1 -> SiLU -> linear_2 (diffusers TimestepEmbedding / PixArtAlphaTextProjection with
    act_fn="silu"; both have this shape). Runs in fp32."""

    def __init__(self, in_dim: int, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32,
                 in_axis=None):
        kw = dict(rngs=rngs, dtype=jnp.float32, param_dtype=param_dtype)
        self.linear_1 = Linear(in_dim, dim, axes=(in_axis, "embed"), **kw)
        self.linear_2 = Linear(dim, dim, axes=("embed", None), **kw)

    def __call__(self, x):
        return self.linear_2(jax.nn.silu(self.linear_1(x.astype(jnp.float32))))


class CombinedTimestepTextProjEmbeddings(nnx.Module):
    """temb = MLP(sinusoid(t)) + MLP(pooled text), fp32 (diffusers module of the same name)."""

    time_channels = 256  # diffusers hard-codes Timesteps(num_channels=256, True, 0)

    def __init__(self, dim: int, pooled_projection_dim: int, *, rngs: nnx.Rngs,
                 param_dtype=jnp.float32):
        self.timestep_embedder = TimestepEmbedding(self.time_channels, dim, rngs=rngs,
                                                   param_dtype=param_dtype)
        self.text_embedder = TimestepEmbedding(pooled_projection_dim, dim, rngs=rngs,
                                               param_dtype=param_dtype)

    def __call__(self, timestep, pooled_projection):
        t = timestep_embedding(timestep, self.time_channels, flip_sin_to_cos=True,
                               downscale_freq_shift=0.0)
        return self.timestep_embedder(t) + self.text_embedder(pooled_projection)
