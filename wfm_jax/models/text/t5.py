"""T5 encoder (transformers' T5EncoderModel), as SD3 uses T5 v1.1 XXL, and UMT5 (transformers'
UMT5EncoderModel, Wan's text encoder), which differs only in owning one relative-position bias
table per layer instead of sharing layer 0's (`per_layer_position_bias`).

T5 differs from a textbook encoder in four ways that matter for parity: no 1/sqrt(d) attention
scaling; a learned relative-position bias, owned by the first layer and added in every layer;
RMS norms without mean subtraction or bias (fp32); and, for v1.1, a gated-GELU (tanh) FFN.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.norms import RMSNorm
from wfm_jax.models.text.activations import activation

ACT_AXES = ("act_batch", "act_seq", "act_embed")


@dataclasses.dataclass(frozen=True)
class T5Config:
    """The fields of a transformers T5Config that change the encoder's computation."""
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    # UMT5: every layer has its own relative_attention_bias (not a transformers config key)
    per_layer_position_bias: bool = False

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "T5Config":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names and v is not None})

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.split("-")[0] == "gated"

    @property
    def act_name(self) -> str:
        # transformers maps the legacy "gated-gelu" to the tanh GELU (gelu_new)
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]


def relative_position_buckets(query_len: int, key_len: int, num_buckets: int,
                              max_distance: int) -> np.ndarray:
    """(query_len, key_len) int32 bucket of (key - query) for bidirectional attention.

    Half the buckets per direction; within one, distances below num_buckets/4 get their own bucket
    and larger ones share log-spaced buckets up to max_distance. The log is taken in float32 in the
    same order as transformers, so boundary cases land in the same bucket.
    """
    rel = np.arange(key_len)[None, :] - np.arange(query_len)[:, None]
    half = num_buckets // 2
    buckets = (rel > 0).astype(np.int64) * half
    dist = np.abs(rel)
    max_exact = half // 2
    with np.errstate(divide="ignore"):  # log(0) only where dist < max_exact (exact bucket)
        scaled = (np.log(dist.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact)) * np.float32(half - max_exact))
    large = max_exact + np.where(np.isfinite(scaled), scaled, 0).astype(np.int64)
    large = np.minimum(large, half - 1)
    return (buckets + np.where(dist < max_exact, dist, large)).astype(np.int32)


class T5Attention(nnx.Module):
    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        inner = cfg.num_heads * cfg.d_kv
        self.num_heads, self.head_dim = cfg.num_heads, cfg.d_kv
        kw = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        self.q = Linear(cfg.d_model, inner, axes=("embed", "heads"), **kw)
        self.k = Linear(cfg.d_model, inner, axes=("embed", "heads"), **kw)
        self.v = Linear(cfg.d_model, inner, axes=("embed", "heads"), **kw)
        self.o = Linear(inner, cfg.d_model, axes=("heads", "embed"), **kw)

    def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
        """x (B, S, D); bias (B or 1, H, S, S) fp32: position bias plus the padding mask."""
        b, s, _ = x.shape
        split = lambda t: t.reshape(b, s, self.num_heads, self.head_dim)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) + bias  # no 1/sqrt(d)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, -1)
        return self.o(out)


class T5FeedForward(nnx.Module):
    """wo(act(wi_0 x) * wi_1 x) when gated (v1.1), else wo(act(wi x))."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        self.act = activation(cfg.act_name)
        if cfg.is_gated:
            self.wi_0 = Linear(cfg.d_model, cfg.d_ff, axes=("embed", "mlp"), **kw)
            self.wi_1 = Linear(cfg.d_model, cfg.d_ff, axes=("embed", "mlp"), **kw)
        else:
            self.wi = Linear(cfg.d_model, cfg.d_ff, axes=("embed", "mlp"), **kw)
        self.wo = Linear(cfg.d_ff, cfg.d_model, axes=("mlp", "embed"), **kw)
        self.gated = cfg.is_gated

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(h)


def _bias_table(cfg: T5Config, rngs: nnx.Rngs, param_dtype):
    return param(nnx.initializers.normal(0.02)(
        rngs.params(), (cfg.relative_attention_num_buckets, cfg.num_heads), param_dtype),
        (None, None))


def _position_bias(table: jax.Array, cfg: T5Config, seq_len: int) -> jax.Array:
    """(1, H, S, S) fp32 learned bias looked up by relative-position bucket."""
    buckets = relative_position_buckets(seq_len, seq_len, cfg.relative_attention_num_buckets,
                                        cfg.relative_attention_max_distance)
    return jnp.transpose(table.astype(jnp.float32)[buckets], (2, 0, 1))[None]


class T5Block(nnx.Module):
    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.relative_attention_bias = (_bias_table(cfg, rngs, param_dtype)
                                        if cfg.per_layer_position_bias else None)
        norm = dict(eps=cfg.layer_norm_epsilon, param_dtype=param_dtype, axes=("embed",))
        self.attn_norm = RMSNorm(cfg.d_model, **norm)
        self.attn = T5Attention(cfg, **kw)
        self.ff_norm = RMSNorm(cfg.d_model, **norm)
        self.ff = T5FeedForward(cfg, **kw)

    def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), bias)
        x = x + self.ff(self.ff_norm(x))
        return constrain(x, ACT_AXES)


class T5Encoder(nnx.Module):
    """Port of transformers' T5EncoderModel; returns last_hidden_state (final norm applied)."""

    def __init__(self, cfg: T5Config, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.cfg = cfg
        self.dtype = dtype
        self.shared = param(nnx.initializers.normal(1.0)(
            rngs.params(), (cfg.vocab_size, cfg.d_model), param_dtype), ("vocab", "embed"))
        # T5: owned by layer 0 in transformers, added in every layer; UMT5: one per block
        self.relative_attention_bias = (None if cfg.per_layer_position_bias
                                        else _bias_table(cfg, rngs, param_dtype))
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.blocks = nnx.List([T5Block(cfg, **kw) for _ in range(cfg.num_layers)])
        self.final_layer_norm = RMSNorm(cfg.d_model, eps=cfg.layer_norm_epsilon,
                                        param_dtype=param_dtype, axes=("embed",))

    def position_bias(self, seq_len: int) -> jax.Array:
        """(1, H, S, S) fp32 shared bias (T5 only; UMT5 blocks hold their own tables)."""
        table = self.relative_attention_bias
        assert table is not None  # UMT5 encoders hold one table per block instead
        return _position_bias(table[...], self.cfg, seq_len)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """input_ids (B, S) int; attention_mask (B, S) (1 = token, 0 = padding) or None."""
        dtype = self.dtype or self.shared[...].dtype
        x = constrain(jnp.take(self.shared[...], input_ids, axis=0).astype(dtype), ACT_AXES)
        seq = input_ids.shape[1]
        mask: jax.Array | float = 0.0
        if attention_mask is not None:  # padded keys get the most negative fp32, as transformers
            keep = attention_mask.astype(bool)[:, None, None, :]
            mask = jnp.where(keep, 0.0, jnp.finfo(jnp.float32).min)
        shared = None if self.relative_attention_bias is None else self.position_bias(seq) + mask
        for block in self.blocks:
            own = block.relative_attention_bias
            bias = shared if own is None else _position_bias(own[...], self.cfg, seq) + mask
            assert bias is not None  # T5: the shared table; UMT5: each block's own
            x = block(x, bias)
        return self.final_layer_norm(x)


def make_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs) -> T5Encoder:
    return T5Encoder(T5Config.from_dict(config), rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def make_umt5_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
                    rngs: nnx.Rngs) -> T5Encoder:
    cfg = dataclasses.replace(T5Config.from_dict(config), per_layer_position_bias=True)
    return T5Encoder(cfg, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
