"""SANA's input embeddings: the 2D patch embedding, the timestep (and guidance) embedding, and
the caption projection + norm.

The timestep path runs in fp32 whatever the compute dtype (sinusoid, MLP and the 6 D projection
feed every block's modulation). SANA-Video's patch embedding is Wan's Conv3d
(wan.embeddings.PatchEmbed3D) and its caption projection is the same PixArtAlphaTextProjection
(wan.embeddings.TextProjection): both are imported, not copied.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.embeddings import TimestepEmbedding, _PatchProj, sincos_2d_pos_embed, timestep_embedding
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm
from wfm_jax.models.wan.embeddings import TextProjection

TIME_CHANNELS = 256  # diffusers hard-codes Timesteps(num_channels=256, True, 0)


def _sinusoid(t):
    return timestep_embedding(t, TIME_CHANNELS, flip_sin_to_cos=True, downscale_freq_shift=0.0)


class PatchEmbed2D(nnx.Module):
    """diffusers PatchEmbed as SANA builds it: a stride-p conv, flattened row-major over (h, w);
    with `interpolation_scale` set, plus the 2D sincos table for the input grid (computed at
    trace time, never stored: diffusers' buffer is not persistent). The released SANA1.5 has
    interpolation_scale None: no position embedding at all."""

    def __init__(self, *, sample_size: int, patch_size: int, in_channels: int, dim: int,
                 interpolation_scale, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.dim, self.base_size = dim, sample_size // patch_size
        self.interpolation_scale = interpolation_scale
        self.proj = _PatchProj(patch_size, in_channels, dim, rngs=rngs, dtype=dtype,
                               param_dtype=param_dtype)

    def __call__(self, x_nchw):
        """(B, C, H, W) -> tokens (B, h * w, D) and the grid (h, w)."""
        tokens, (h, w) = self.proj(jnp.transpose(x_nchw, (0, 2, 3, 1)))
        if self.interpolation_scale is None:
            return tokens, (h, w)
        pos = sincos_2d_pos_embed(self.dim, h, w, base_size=self.base_size,
                                  interpolation_scale=self.interpolation_scale)
        return (tokens.astype(jnp.float32) + jnp.asarray(pos)[None]).astype(tokens.dtype), (h, w)


class _TimestepOnly(nnx.Module):
    """diffusers PixArtAlphaCombinedTimestepSizeEmbeddings without size conditions."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        self.timestep_embedder = TimestepEmbedding(TIME_CHANNELS, dim, rngs=rngs,
                                                   param_dtype=param_dtype)

    def __call__(self, t):
        return self.timestep_embedder(_sinusoid(t))


class AdaLayerNormSingle(nnx.Module):
    """diffusers AdaLayerNormSingle: temb = emb(t) (N, D); tproj = linear(SiLU(temb)) (N, 6D)."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        self.emb = _TimestepOnly(dim, rngs=rngs, param_dtype=param_dtype)
        self.linear = Linear(dim, 6 * dim, axes=("embed", None), rngs=rngs, dtype=jnp.float32,
                             param_dtype=param_dtype)

    def __call__(self, t, guidance=None):
        temb = self.emb(t)
        return self.linear(jax.nn.silu(temb)), temb


class TimestepGuidanceEmbedding(nnx.Module):
    """diffusers SanaCombinedTimestepGuidanceEmbeddings (guidance_embeds=True, SANA-Sprint):
    temb = MLP(sinusoid(t)) + MLP(sinusoid(guidance)); tproj = linear(SiLU(temb))."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.timestep_embedder = TimestepEmbedding(TIME_CHANNELS, dim, **kw)
        self.guidance_embedder = TimestepEmbedding(TIME_CHANNELS, dim, **kw)
        self.linear = Linear(dim, 6 * dim, axes=("embed", None), dtype=jnp.float32, **kw)

    def __call__(self, t, guidance):
        temb = self.timestep_embedder(_sinusoid(t)) + self.guidance_embedder(_sinusoid(guidance))
        return self.linear(jax.nn.silu(temb)), temb


def time_embedding(dim: int, guidance_embeds: bool, *, rngs, param_dtype):
    cls = TimestepGuidanceEmbedding if guidance_embeds else AdaLayerNormSingle
    return cls(dim, rngs=rngs, param_dtype=param_dtype)


def caption_layers(caption_channels: int, dim: int, *, rngs, dtype, param_dtype):
    """(caption_projection, caption_norm): PixArtAlphaTextProjection (tanh-GELU) and an affine
    RMSNorm with eps 1e-5."""
    proj = TextProjection(caption_channels, dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    return proj, RMSNorm(dim, eps=1e-5, param_dtype=param_dtype, axes=("embed",))
