"""Cosmos's input embeddings: the patch embedding of [latent, condition mask, padding mask]
(diffusers `CosmosPatchEmbed`, the padding-mask resize of the forward) and the time embedding
(`CosmosEmbedding`).

The time path runs in fp32 whatever the compute dtype (design rule: modulation in fp32); its two
outputs drive every block's adaLN-LoRA.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.models.layers.embeddings import timestep_embedding
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm


def nearest_indices(size_in: int, size_out: int) -> np.ndarray:
    """Source rows of torch's F.interpolate(mode="nearest") (= torchvision's tensor
    resize(NEAREST), which diffusers calls): min(floor(i * (in / out)), in - 1) in float32."""
    if size_in == size_out:
        return np.arange(size_out)
    scale = np.float32(size_in) / np.float32(size_out)
    idx = np.floor(np.arange(size_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(idx, size_in - 1)


def resize_nearest(mask: jax.Array, height: int, width: int) -> jax.Array:
    """(B, C, h, w) -> (B, C, height, width) by nearest neighbour, torch's index rule."""
    rows = nearest_indices(mask.shape[-2], height)
    cols = nearest_indices(mask.shape[-1], width)
    return mask[..., rows, :][..., cols]


class PatchEmbed(nnx.Module):
    """Patches of (C, pt, ph, pw) flattened in that order, then a Linear with no bias."""

    def __init__(self, patch: tuple[int, int, int], cin: int, dim: int, *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        self.patch = tuple(patch)
        self.proj = Linear(cin * math.prod(patch), dim, bias=False, axes=("conv_in", "embed"),
                           rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x):
        """(B, C, T, H, W) -> tokens (B, F * Hp * Wp, D) row-major over (f, h, w), and the grid."""
        b, c, t, h, w = x.shape
        pt, ph, pw = self.patch
        if t % pt or h % ph or w % pw:
            raise ValueError(f"latent size (T, H, W) = ({t}, {h}, {w}) is not divisible by "
                             f"patch_size={self.patch}")
        grid = (t // pt, h // ph, w // pw)
        x = x.reshape(b, c, grid[0], pt, grid[1], ph, grid[2], pw)
        x = jnp.transpose(x, (0, 2, 4, 6, 1, 3, 5, 7)).reshape(b, math.prod(grid), -1)
        return self.proj(x), grid


class _TimestepMLP(nnx.Module):
    """diffusers CosmosTimestepEmbedding: linear_1 (D -> D), SiLU, linear_2 (D -> 3D), no bias."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, bias=False, dtype=jnp.float32, param_dtype=param_dtype)
        self.linear_1 = Linear(dim, dim, axes=(None, "embed"), **kw)
        self.linear_2 = Linear(dim, 3 * dim, axes=("embed", None), **kw)

    def __call__(self, x):
        return self.linear_2(jax.nn.silu(self.linear_1(x)))


class CosmosTimeEmbedding(nnx.Module):
    """sinusoid(t) (flip_sin_to_cos, shift 0; t is sigma in [0, 1], no x1000) ->
    temb = t_embedder(sinusoid) (3D) and embedded_timestep = RMSNorm(sinusoid) (D), fp32."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        self.dim = dim
        self.t_embedder = _TimestepMLP(dim, rngs=rngs, param_dtype=param_dtype)
        self.norm = RMSNorm(dim, eps=1e-6, param_dtype=param_dtype)

    def __call__(self, timestep):
        """timestep (N,) -> (temb (N, 3D), embedded_timestep (N, D)) fp32."""
        proj = timestep_embedding(timestep, self.dim, flip_sin_to_cos=True,
                                  downscale_freq_shift=0.0)
        return self.t_embedder(proj), self.norm(proj)
