"""Text and VAE encoding for training, outside the gradient: each its own jit over the mesh.

Randomness is per sample, keyed by the sample's id inside the global batch (its position in the
data stream's batch, whichever process loaded it), so a sample gets the same VAE draw and noise
whether the batch was assembled by one process or by many.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.mesh import mesh_jit
from wfm_jax.models.sd3.pipeline import SD3Pipeline, encode_tokens
from wfm_jax.models.vae.autoencoder_kl import scale_latents


def per_sample_normal(key: jax.Array, ids: jax.Array, shape: Sequence[int]) -> jax.Array:
    """(B, *shape) float32 standard normals; row i drawn from fold_in(key, ids[i])."""
    return jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), tuple(shape),
                                                jnp.float32))(ids)


def local_sample_ids(local_batch: int) -> np.ndarray:
    """Ids of this process's rows: the loader gives process p the items p, p + n, p + 2n, ...
    of each global batch (n processes), so local row k is item p + k * n."""
    n, p = jax.process_count(), jax.process_index()
    return (p + n * np.arange(local_batch)).astype(np.int32)


@functools.lru_cache(maxsize=8)
def _text_fn(graphdef, joint_attention_dim: int, max_len: int, out_sharding):
    """One jitted encoder per (structure, sizes, sharding): a second run in the same process
    (a resumed run, a test) reuses the compiled program."""
    def encode(state, ids):
        return encode_tokens(nnx.merge(graphdef, state), ids, joint_attention_dim, max_len)

    if out_sharding is None:
        return jax.jit(encode)
    return mesh_jit(encode, mesh=out_sharding.mesh, out_shardings=(out_sharding, out_sharding))


@functools.lru_cache(maxsize=8)
def _visual_fn(graphdef, vae_config_items: tuple, out_sharding):
    vae_config = dict(vae_config_items)

    def encode(state, pixels, key, ids):
        vae = nnx.merge(graphdef, state)
        dist = vae.encode(jnp.transpose(pixels, (0, 3, 1, 2)))
        eps = per_sample_normal(key, ids, dist.mean.shape[1:])
        z = dist.mean.astype(jnp.float32) + dist.std.astype(jnp.float32) * eps
        return scale_latents(z, vae_config)

    if out_sharding is None:
        return jax.jit(encode)
    return mesh_jit(encode, mesh=out_sharding.mesh, out_shardings=out_sharding)


def _hashable(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


class TextEncoder:
    """prompts -> (prompt_embeds (B, 77 + L, D), pooled (B, P)) in float32, as diffusers."""

    def __init__(self, pipe: SD3Pipeline, max_sequence_length: int, out_sharding=None):
        self.pipe, self.max_len = pipe, int(max_sequence_length)
        graphdef, self.state = nnx.split(list(pipe.text_encoders))
        self._encode = _text_fn(graphdef, int(pipe.transformer_config["joint_attention_dim"]),
                                self.max_len, out_sharding)

    def tokenize(self, prompts: Sequence[str]) -> dict:
        """Host int32 ids per encoder (this process's prompts)."""
        return self.pipe.tokenize(list(prompts), self.max_len)

    def __call__(self, ids: dict):
        return self._encode(self.state, ids)


class VisualEncoder:
    """pixels (B, H, W, 3) in [-1, 1] -> scaled latents (B, C, h, w), one posterior sample per
    row from fold_in(key, id) (diffusers' SD3 scripts sample `latent_dist`)."""

    def __init__(self, pipe: SD3Pipeline, out_sharding=None):
        graphdef, self.state = nnx.split(pipe.vae)
        self._encode = _visual_fn(graphdef, _hashable(pipe.vae_config), out_sharding)

    def __call__(self, pixels, key, ids):
        return self._encode(self.state, pixels, key, ids)
