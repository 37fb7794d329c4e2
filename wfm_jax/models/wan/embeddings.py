"""Wan's input embeddings: the 3D patch embedding and the time / text condition embedder
(diffusers `WanTimeTextImageEmbedding`, text-to-video part; no image embedder).

The time path (sinusoid, time_embedder, time_proj) runs in fp32 whatever the compute dtype:
its outputs are the modulation of every block (diffusers keeps time_embedder in fp32; wfm_jax
keeps time_proj there too, design rule: modulation in fp32).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.embeddings import TimestepEmbedding, timestep_embedding
from wfm_jax.models.layers.linear import Linear, param


class PatchEmbed3D(nnx.Module):
    """Conv3d(kernel = stride = patch) as one matmul over non-overlapping patches; kernel stored
    (pt, ph, pw, C, D) (torch's OIDHW moved to DHWIO by the converter)."""

    def __init__(self, patch: tuple[int, int, int], cin: int, dim: int, *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        self.patch, self.dtype = tuple(patch), dtype
        fan_in = math.prod(patch) * cin
        init = jax.random.normal(rngs.params(), (*patch, cin, dim), param_dtype) / math.sqrt(fan_in)
        self.kernel = param(init, (None, None, None, "conv_in", "embed"))
        self.bias = param(jnp.zeros((dim,), param_dtype), ("embed",))

    def __call__(self, x):
        """(B, C, T, H, W) -> tokens (B, F * Hp * Wp, D) row-major over (f, h, w), and the grid."""
        b, c, t, h, w = x.shape
        pt, ph, pw = self.patch
        if t % pt or h % ph or w % pw:
            raise ValueError(f"latent size (T, H, W) = ({t}, {h}, {w}) is not divisible by "
                             f"patch_size={self.patch}")
        grid = (t // pt, h // ph, w // pw)
        dtype = self.dtype or x.dtype
        patches = x.astype(dtype).reshape(b, c, grid[0], pt, grid[1], ph, grid[2], pw)
        out = jnp.einsum("bcfthpwq,tpqcd->bfhwd", patches, self.kernel[...].astype(dtype))
        out = out + self.bias[...].astype(dtype)
        return out.reshape(b, math.prod(grid), -1), grid


class TextProjection(nnx.Module):
    """diffusers PixArtAlphaTextProjection(act_fn="gelu_tanh"): linear_1, tanh-GELU, linear_2."""

    def __init__(self, in_dim: int, dim: int, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.linear_1 = Linear(in_dim, dim, axes=(None, "embed"), **kw)
        self.linear_2 = Linear(dim, dim, axes=("embed", None), **kw)

    def __call__(self, x):
        return self.linear_2(jax.nn.gelu(self.linear_1(x), approximate=True))


class WanConditionEmbedder(nnx.Module):
    """temb = time_embedder(sinusoid(t)); tproj = time_proj(SiLU(temb)) (6 D per sample, the
    blocks' modulation); text = text_embedder(UMT5 states)."""

    def __init__(self, dim: int, freq_dim: int, text_dim: int, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim, rngs=rngs, param_dtype=param_dtype)
        self.time_proj = Linear(dim, 6 * dim, axes=("embed", None), rngs=rngs, dtype=jnp.float32,
                                param_dtype=param_dtype)
        self.text_embedder = TextProjection(text_dim, dim, rngs=rngs, dtype=dtype,
                                            param_dtype=param_dtype)

    def __call__(self, timestep, text):
        """timestep (B,) (diffusers feeds int64 ~1000 sigma; any float works) -> (temb (B, D),
        tproj (B, 6, D)) fp32 and the projected text (B, L, D) in the compute dtype."""
        t = timestep_embedding(timestep, self.freq_dim, flip_sin_to_cos=True,
                               downscale_freq_shift=0.0)
        temb = self.time_embedder(t)
        tproj = self.time_proj(jax.nn.silu(temb))
        return temb, tproj.reshape(tproj.shape[0], 6, -1), self.text_embedder(text)
