"""Qwen3-VL generation with a KV cache: greedy, or seeded temperature / top-k / top-p sampling.

One jit-compiled prefill over the (left-padded) prompt fills the cache and picks the first token;
one jit-compiled `lax.while_loop` decodes the rest, one token per step, until every row has
emitted an end token or `max_new_tokens` are out. As transformers' `generate`:
  - text positions continue from the last prompt position (+1 per step), the M-RoPE rows from
    the last prompt token's ids, so the rope delta left by visual tokens carries on;
  - DeepStack features enter only in the prefill (visual tokens are all in the prompt);
  - rows that have finished emit `pad_token_id`; greedy is the first argmax of fp32 logits;
  - sampling applies temperature, then top-k, then top-p (nucleus), then draws.
The random stream is JAX's, so sampled tokens are reproducible per seed but not torch's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.core.mesh import logical_to_spec, mesh_size_for
from wfm_jax.models.qwen3_vl.model import Qwen3VLForConditionalGeneration, init_cache
from wfm_jax.models.qwen3_vl.rope_index import position_ids as rope_position_ids


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"bad sampling settings {self}: need temperature >= 0, top_k >= 0, "
                             f"0 < top_p <= 1")


def choose(logits: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """Next token ids (B,) from fp32 logits (B, V)."""
    logits = logits.astype(jnp.float32)
    if sampling.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / sampling.temperature
    neg = jnp.finfo(jnp.float32).min
    if sampling.top_k:
        kth = jax.lax.top_k(logits, min(sampling.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if sampling.top_p < 1:
        order = jnp.argsort(-logits, axis=-1)
        probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
        drop_sorted = before > sampling.top_p  # always keeps the most likely token
        drop = jnp.zeros_like(drop_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(
            drop_sorted)
        logits = jnp.where(drop, neg, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def prefill(model, ids, kv_mask, pos, pixels, video_pixels, key, *, image_grid, video_grid, cache_len,
            cache_dtype, sampling):
    """The prompt's forward pass: (first tokens (B,), their fp32 logits (B, V), the filled cache)."""
    cache = init_cache(model.config, ids.shape[0], cache_len, cache_dtype)
    out = model(ids, kv_mask, pos, pixels, None if image_grid is None else np.array(image_grid),
                video_pixels, None if video_grid is None else np.array(video_grid), cache=cache,
                cache_index=0, last_only=True)
    logits = out["logits"][:, -1].astype(jnp.float32)
    return choose(logits, key, sampling), logits, out["cache"]


def decode(model, cache, first, first_logits, kv_mask, last_pos, key, *, max_new, eos, pad, sampling,
           keep_logits):
    """The token-by-token loop after `prefill`: (tokens (B, max_new), steps taken, logits or None,
    the cache). Returning the cache lets a caller that donates it have the loop write in place."""
    b, prompt_len = first.shape[0], kv_mask.shape[1] - max_new
    eos = jnp.asarray(eos, jnp.int32)
    tokens = jnp.full((b, max_new), pad, jnp.int32).at[:, 0].set(first)
    done = jnp.isin(first, eos)
    # per-step fp32 logits (B, T, V) only when asked: at a real vocab this is the big buffer
    logits = (jnp.zeros((b, max_new, first_logits.shape[-1]), jnp.float32).at[:, 0].set(first_logits)
              if keep_logits else None)

    def cond(carry):
        k, _, done, _, _, _ = carry
        return (k < max_new) & ~jnp.all(done)

    def body(carry):
        k, tokens, done, cache, key, logits = carry
        prev = jax.lax.dynamic_index_in_dim(tokens, k - 1, axis=1, keepdims=True)
        pos = (last_pos + k)[:, :, None]  # (4, B, 1): every row one further per step
        out = model(prev, kv_mask, pos, cache=cache, cache_index=prompt_len + k - 1, last_only=True)
        key, sub = jax.random.split(key)
        step = out["logits"][:, -1].astype(jnp.float32)
        nxt = jnp.where(done, pad, choose(step, sub, sampling))
        tokens = jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, k))
        if keep_logits:
            logits = jax.lax.dynamic_update_slice(logits, step[:, None], (0, k, 0))
        return k + 1, tokens, done | jnp.isin(nxt, eos), out["cache"], key, logits

    k, tokens, _, cache, _, logits = jax.lax.while_loop(
        cond, body, (jnp.asarray(1), tokens, done, cache, key, logits))
    return tokens, k, logits, cache


@functools.partial(jax.jit, static_argnames=("graphdef", "image_grid", "video_grid", "cache_len",
                                             "cache_dtype", "sampling"))
def _prefill(graphdef, state, ids, kv_mask, pos, pixels, video_pixels, key, **static):
    return prefill(nnx.merge(graphdef, state), ids, kv_mask, pos, pixels, video_pixels, key, **static)


# the cache is donated and returned: the loop updates it in place, not in a copy beside it
@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "eos", "pad", "sampling",
                                             "keep_logits"), donate_argnames=("cache",))
def _decode(graphdef, state, cache, first, first_logits, kv_mask, last_pos, key, **static):
    return decode(nnx.merge(graphdef, state), cache, first, first_logits, kv_mask, last_pos, key, **static)


def generate(model: Qwen3VLForConditionalGeneration, input_ids, attention_mask=None, *,
             pixel_values=None, image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None,
             max_new_tokens: int, sampling: Sampling = Sampling(), seed: int = 0,
             eos_token_ids=None, pad_token_id: int | None = None, cache_dtype=None,
             return_logits: bool = False, mesh=None):
    """Generated ids (B, T) int32, T <= max_new_tokens (stops when every row has ended; ended
    rows hold pad_token_id after their end token). Prompts must be left-padded.
    return_logits: also return the fp32 logits each step chose from, (B, T, V).
    mesh: the mesh the model's weights live on; the rows are split over its data x fsdp axes
    (B must divide by them) and both programs trace under it, so each device holds its rows'
    cache only. Without it the rows go wherever XLA propagates them.

    eos_token_ids / pad_token_id default to the text config's eos / pad (pad: the first eos)."""
    cfg = model.config
    ids = np.asarray(input_ids, np.int64)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape} must be equal (B, L)")
    if not mask[:, -1].all():
        raise ValueError("generation needs left padding: attention_mask[:, -1] must be all 1")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if eos_token_ids is None:
        eos_token_ids = cfg.text_extra.get("eos_token_id", [])
    eos = tuple(int(e) for e in np.atleast_1d(eos_token_ids))
    if pad_token_id is None:
        pad_token_id = cfg.text_extra.get("pad_token_id", eos[0] if eos else 0)
    def grid(g):
        return None if g is None else tuple(tuple(int(v) for v in r)
                                                      for r in np.asarray(g).reshape(-1, 3))
    pos, _ = rope_position_ids(ids, mask, image_grid_thw=image_grid_thw,
                               video_grid_thw=video_grid_thw, image_token_id=cfg.image_token_id,
                               video_token_id=cfg.video_token_id,
                               spatial_merge_size=cfg.vision.spatial_merge_size)
    graphdef, state = nnx.split(model)
    dtype = cache_dtype or model.model.language_model.compute_dtype
    kv_mask = np.concatenate([mask, np.ones((ids.shape[0], max_new_tokens), np.int64)], axis=1)
    key, sub = jax.random.split(jax.random.key(seed))
    rows = functools.partial(_split_rows, mesh=mesh)
    with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
        first, first_logits, cache = _prefill(
            graphdef, state, rows(ids.astype(np.int32)), rows(kv_mask.astype(np.int32)),
            rows(pos.astype(np.int32), axis=1), pixel_values, pixel_values_videos, sub,
            image_grid=grid(image_grid_thw), video_grid=grid(video_grid_thw), cache_len=kv_mask.shape[1],
            cache_dtype=jnp.dtype(dtype), sampling=sampling)
        tokens, steps, logits, _ = _decode(
            graphdef, state, cache, first, first_logits, rows(kv_mask.astype(np.int32)),
            rows(np.ascontiguousarray(pos[:, :, -1]).astype(np.int32), axis=1), key, max_new=max_new_tokens,
            eos=eos, pad=int(pad_token_id), sampling=sampling, keep_logits=return_logits)
    tokens = np.asarray(tokens)[:, :int(steps)]
    return (tokens, np.asarray(logits)[:, :int(steps)]) if return_logits else tokens


def _split_rows(x: np.ndarray, mesh, axis: int = 0) -> jax.Array:
    """A host array with its rows (`axis`) split over the mesh's batch axes (data x fsdp); as it
    is without a mesh."""
    if mesh is None:
        return jnp.asarray(x)
    shards = mesh_size_for(mesh, "act_batch")
    if x.shape[axis] % shards:
        raise ValueError(f"{x.shape[axis]} rows do not split over the mesh's {shards} batch shards")
    return jax.device_put(x, NamedSharding(mesh, P(*([None] * axis), *logical_to_spec(("act_batch",)))))
