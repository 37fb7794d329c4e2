"""Qwen3-VL for conditional generation (transformers' Qwen3VLForConditionalGeneration) in Flax NNX.

The module tree spells the checkpoint keys: `model.visual.*`, `model.language_model.*`, and
`lm_head` only when the config does not tie it to the embeddings.

Visual tokens: the merged vision features replace the embeddings at image / video pad tokens in
sequence order (row-major over the batch, as `masked_scatter`); the DeepStack features of the same
tokens are added to the outputs of the first decoder layers. `grid_thw` arrays must be concrete
(static under jit): the vision layout is computed from them on the host.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.qwen3_vl.config import Qwen3VLConfig, as_config
from wfm_jax.models.qwen3_vl.text import Qwen3VLTextModel
from wfm_jax.models.qwen3_vl.vision import Qwen3VLVisionModel


def _concrete(x) -> np.ndarray | None:
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _scatter_index(mask: jax.Array, n_features: int, kind: str) -> jax.Array:
    """For each position, the index of the feature row it takes (row-major over the batch)."""
    ids = _concrete(mask)
    if ids is not None and int(ids.sum()) != n_features:
        raise ValueError(f"{kind} features and {kind} tokens do not match: {int(ids.sum())} tokens, "
                         f"{n_features} features")
    idx = jnp.cumsum(mask.reshape(-1).astype(jnp.int32)) - 1
    return jnp.clip(idx, 0, max(n_features - 1, 0)).reshape(mask.shape)


class Qwen3VLModel(nnx.Module):
    def __init__(self, cfg: Qwen3VLConfig, *, rngs, dtype, param_dtype, remat, scan_layers):
        self.visual = Qwen3VLVisionModel(cfg.vision, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                                         remat=remat)
        self.language_model = Qwen3VLTextModel(cfg.text, rngs=rngs, dtype=dtype,
                                               param_dtype=param_dtype, remat=remat,
                                               scan_layers=scan_layers)


class Qwen3VLForConditionalGeneration(nnx.Module):
    def __init__(self, config: Qwen3VLConfig | Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32, remat: str = "everything_saveable", scan_layers: bool = False):
        """dtype: compute dtype (None: the parameters' dtype); param_dtype: stored weights;
        remat: a wfm_jax.models.layers.remat policy per block; scan_layers: run the decoder
        layers as one lax.scan (same numbers, one compiled layer)."""
        self.config = cfg = as_config(config)
        self.model = Qwen3VLModel(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype, remat=remat,
                                  scan_layers=scan_layers)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.text.hidden_size, cfg.text.vocab_size, bias=False, axes=("embed", "vocab"),
            rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def logits(self, hidden: jax.Array) -> jax.Array:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        table = self.model.language_model.embed_tokens[...].astype(hidden.dtype)
        return jnp.einsum("bld,vd->blv", hidden, table)

    def embed(self, input_ids, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
              video_grid_thw=None) -> tuple[jax.Array, jax.Array | None]:
        """Input embeddings with visual features in place, and the DeepStack additions
        (n, B, L, D) (zero away from visual tokens), or None without visual input."""
        cfg = self.config
        lm = self.model.language_model
        x = lm.embed(input_ids)
        adds = None
        for kind, pixels, grid, token in (("image", pixel_values, image_grid_thw, cfg.image_token_id),
                                          ("video", pixel_values_videos, video_grid_thw,
                                           cfg.video_token_id)):
            if pixels is None:
                continue
            if grid is None:
                raise ValueError(f"{kind} pixel values need their grid_thw")
            feats, deepstack = self.model.visual(pixels, grid)
            mask = input_ids == token
            idx = _scatter_index(mask, feats.shape[0], kind)
            x = jnp.where(mask[..., None], feats.astype(x.dtype)[idx], x)
            ds = jnp.stack([jnp.where(mask[..., None], f.astype(x.dtype)[idx], 0) for f in deepstack])
            adds = ds if adds is None else adds + ds  # image and video tokens never overlap
        return x, adds

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 position_ids: jax.Array | None = None, pixel_values: jax.Array | None = None,
                 image_grid_thw=None, pixel_values_videos: jax.Array | None = None,
                 video_grid_thw=None, *, cache: Mapping[str, jax.Array] | None = None,
                 cache_index: jax.Array | int = 0, output_hidden_states: bool = False,
                 last_only: bool = False):
        """input_ids (B, L). attention_mask: (B, L) without a cache (1 token, 0 padding), or
        (B, S) over the whole cache with one (slots not yet written are masked by causality).
        position_ids: (4, B, L) or (3, B, L) from `rope_index.position_ids` (required with visual
        input or padding; default 0..L-1 as transformers' text-only forward).
        cache: {"k", "v"} from `init_cache`, written at slots cache_index..cache_index+L-1.

        Returns a dict: logits (B, L or 1, V) in the compute dtype, hidden_states (transformers'
        tuple) when asked, cache when one was given.
        """
        b, n = input_ids.shape
        x, deepstack = self.embed(input_ids, pixel_values, image_grid_thw, pixel_values_videos,
                                  video_grid_thw)
        if position_ids is None:
            if pixel_values is not None or pixel_values_videos is not None:
                raise ValueError("visual input needs position_ids from rope_index.position_ids")
            position_ids = jnp.broadcast_to(jnp.arange(n) + cache_index, (3, b, n))
        if position_ids.ndim != 3 or position_ids.shape[0] not in (3, 4) or (
                tuple(position_ids.shape[1:]) != (b, n)):
            raise ValueError(f"position_ids shape {tuple(position_ids.shape)}: expected (4 or 3, {b}, {n})")
        if position_ids.shape[0] == 4:  # row 0 (text positions) only shapes transformers' mask
            position_ids = position_ids[1:]
        q_slot = jnp.arange(n) + cache_index
        k_len = n if cache is None else cache["k"].shape[2]
        allowed = jnp.arange(k_len)[None, :] <= q_slot[:, None]  # causal by slot
        allowed = jnp.broadcast_to(allowed, (b, 1, n, k_len))
        if attention_mask is not None:
            allowed = allowed & attention_mask.astype(bool)[:, None, None, :]
        hidden, states, cache = self.model.language_model(
            x, position_ids, allowed, deepstack, cache, cache_index, output_hidden_states)
        out: dict[str, Any] = {"logits": self.logits(hidden[:, -1:] if last_only else hidden)}
        if output_hidden_states:
            out["hidden_states"] = states
        if cache is not None:
            out["cache"] = cache
        return out


def init_cache(config: Qwen3VLConfig, batch: int, length: int, dtype=jnp.float32) -> dict:
    t = config.text
    shape = (t.num_hidden_layers, batch, length, t.num_key_value_heads, t.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def make_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
               **options) -> Qwen3VLForConditionalGeneration:
    """options: remat, scan_layers."""
    return Qwen3VLForConditionalGeneration(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                                           **options)
