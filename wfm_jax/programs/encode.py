"""Text and VAE encoding for training, outside the gradient: each its own jit over the mesh.

Randomness is per sample, keyed by the sample's id inside the global batch (its position in the
data stream's batch, whichever process loaded it), so a sample gets the same VAE draw and noise
whether the batch was assembled by one process or by many.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import mesh_jit
from wfm_jax.data.media import SIGNED_UNIT_TABLE
from wfm_jax.families.base import PipelineFamily


def per_sample_normal(key: jax.Array, ids: jax.Array, shape: Sequence[int]) -> jax.Array:
    """(B, *shape) float32 standard normals; row i drawn from fold_in(key, ids[i])."""
    return jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), tuple(shape),
                                                jnp.float32))(ids)


def local_sample_ids(local_batch: int) -> np.ndarray:
    """Ids of this process's rows: the loader gives process p the items p, p + n, p + 2n, ...
    of each global batch (n processes), so local row k is item p + k * n."""
    n, p = jax.process_count(), jax.process_index()
    return (p + n * np.arange(local_batch)).astype(np.int32)


class _Cache:
    """Compiled encoders keyed by (graphdef, family static_key, sizes, sharding): a second run
    in the same process (a resumed run, a test) reuses the compiled program. The closures hold
    the family's shell (configs only), never its weights."""

    def __init__(self, size: int = 8):
        self.size, self.fns = size, {}

    def get(self, key, build):
        if key not in self.fns:
            if len(self.fns) >= self.size:
                self.fns.pop(next(iter(self.fns)))
            self.fns[key] = build()
        return self.fns[key]


_TEXT_FNS, _VISUAL_FNS = _Cache(), _Cache()


def _text_fn(pipe: PipelineFamily, graphdef, max_len: int, out_sharding):
    shell = pipe.shell()

    def build():
        def encode(state, ids):
            return shell.encode_text_with(nnx.merge(graphdef, state), ids, max_len)

        if out_sharding is None:
            return jax.jit(encode)
        return mesh_jit(encode, mesh=out_sharding.mesh, out_shardings=out_sharding)

    return _TEXT_FNS.get((graphdef, pipe.static_key(), max_len, out_sharding), build)


def signed_unit(pixels: jax.Array) -> jax.Array:
    """Pixels as the VAE takes them: uint8 -> float32 [-1, 1] by lookup in numpy's own values
    (media.to_signed_unit, bit for bit); float pixels (already in [-1, 1]) pass unchanged."""
    if pixels.dtype == jnp.uint8:
        return jnp.asarray(SIGNED_UNIT_TABLE)[pixels]
    return pixels


def _draw(shell, mean, std, key, ids):
    """Normalised latents: one posterior sample per row from fold_in(key, id)."""
    eps = per_sample_normal(key, ids, mean.shape[1:])
    z = mean.astype(jnp.float32) + std.astype(jnp.float32) * eps
    return shell.normalize_latents(z)


def _visual_fn(pipe: PipelineFamily, graphdef, out_sharding):
    shell = pipe.shell()

    def build():
        def encode(state, pixels, key, ids):
            mean, std = shell.posterior_with(nnx.merge(graphdef, state), signed_unit(pixels))
            return _draw(shell, mean, std, key, ids)

        if out_sharding is None:
            return jax.jit(encode)
        return mesh_jit(encode, mesh=out_sharding.mesh, out_shardings=out_sharding)

    return _VISUAL_FNS.get((graphdef, pipe.static_key(), out_sharding), build)


def _posterior_fn(pipe: PipelineFamily, graphdef, out_sharding):
    """jit((vae state, pixels) -> (mean, std)): the posterior alone (the encode cache's)."""
    shell = pipe.shell()

    def build():
        def posterior(state, pixels):
            return shell.posterior_with(nnx.merge(graphdef, state), signed_unit(pixels))

        if out_sharding is None:
            return jax.jit(posterior)
        return mesh_jit(posterior, mesh=out_sharding.mesh, out_shardings=out_sharding)

    return _VISUAL_FNS.get(("posterior", graphdef, pipe.static_key(), out_sharding), build)


def _draw_fn(pipe: PipelineFamily, out_sharding):
    """jit((mean, std, key, ids) -> normalised latents): _visual_fn's draw on a given posterior."""
    shell = pipe.shell()

    def build():
        def draw(mean, std, key, ids):
            return _draw(shell, mean, std, key, ids)

        if out_sharding is None:
            return jax.jit(draw)
        return mesh_jit(draw, mesh=out_sharding.mesh, out_shardings=out_sharding)

    return _VISUAL_FNS.get(("draw", pipe.static_key(), out_sharding), build)


class TextEncoder:
    """prompts -> the family's conditioning dict (float32 leaves, batch first), as diffusers'
    encode_prompt (SD3: {"prompt_embeds" (B, 77 + L, D), "pooled_projections" (B, P)})."""

    def __init__(self, pipe: PipelineFamily, max_sequence_length: int, out_sharding=None):
        self.pipe, self.max_len = pipe, int(max_sequence_length)
        graphdef, self.state = nnx.split(list(pipe.text_encoders))
        self._encode = _text_fn(pipe, graphdef, self.max_len, out_sharding)

    def tokenize(self, prompts: Sequence[str], negative: bool = False) -> dict:
        """Host int ids per encoder (this process's prompts); negative: the unconditional
        branch's prompts (family.tokenize_negative)."""
        if negative:
            return self.pipe.tokenize_negative(list(prompts), self.max_len)
        return self.pipe.tokenize(list(prompts), self.max_len)

    def __call__(self, ids: dict) -> dict:
        return self._encode(self.state, ids)


class VisualEncoder:
    """channels-last pixels, uint8 or float in [-1, 1] ((B, H, W, 3), or (B, T, H, W, 3) for
    video families; uint8 is mapped inside the jit, so only a quarter of the bytes move) ->
    normalised latents in diffusers layout, one posterior sample per row from fold_in(key, id)
    (diffusers' training scripts sample `latent_dist`)."""

    def __init__(self, pipe: PipelineFamily, out_sharding=None):
        graphdef, self.state = nnx.split(pipe.vae)
        self._encode = _visual_fn(pipe, graphdef, out_sharding)
        self._posterior = _posterior_fn(pipe, graphdef, out_sharding)
        self._draw = _draw_fn(pipe, out_sharding)

    def __call__(self, pixels, key, ids):
        return self._encode(self.state, pixels, key, ids)

    def posterior(self, pixels):
        """(mean, std) of the VAE's latent distribution (un-normalised, the VAE's dtype)."""
        return self._posterior(self.state, pixels)

    def draw(self, mean, std, key, ids):
        """__call__'s latents from a given posterior: the same per-row draw and normalisation."""
        return self._draw(mean, std, key, ids)
