"""Gemma 2 decoder stack (transformers' Gemma2Model), SANA's and SANA-Video's text encoder.

SANA reads the final-normed last hidden state of gemma-2-2b-it for a right-padded prompt, with the
padding mask applied to the keys (spec video_models.md §1.3). Gemma 2 differs from a textbook
decoder in ways that matter for parity:
  * RMS norms scale by (1 + w), in fp32; four per layer (pre and post attention and MLP);
  * token embeddings are multiplied by sqrt(hidden_size) (the scale rounded to the weight dtype);
  * attention scores are scaled by query_pre_attn_scalar^-1/2 (not head_dim) and soft-capped,
    cap * tanh(s / cap), before the mask;
  * layers alternate a sliding-window causal mask (even layers by default) with a full one;
  * grouped-query attention (query head h reads key/value head h // (heads / kv_heads));
  * rotate-half RoPE over all of head_dim, positions 0..S-1 whatever the padding.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.text.activations import activation

ACT_AXES = ("act_batch", "act_seq", "act_embed")
LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class Gemma2Config:
    """The fields of a transformers Gemma2Config that change Gemma2Model's output (its defaults,
    i.e. gemma-2-2b)."""
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    layer_types: tuple | None = None  # None: sliding on even layers, full on odd (transformers)
    attn_logit_softcapping: float | None = 50.0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "Gemma2Config":
        """From a config.json dict (rope_theta at the top level, or in transformers 5's
        rope_parameters)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items()
              if k in names and k != "rope_theta"}
        rope = dict(config.get("rope_parameters") or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported Gemma2 rope_type {rope['rope_type']!r}; "
                             f"only 'default' RoPE is ported")
        theta = rope.get("rope_theta", config.get("rope_theta"))
        if theta is not None:
            kw["rope_theta"] = float(theta)
        if config.get("use_bidirectional_attention"):
            raise ValueError("Gemma2 use_bidirectional_attention is not supported; "
                             "Gemma2Model is causal")
        cfg = cls(**kw)
        layer_types = cfg.layer_types
        if layer_types is None:
            layer_types = tuple(LAYER_TYPES[i % 2] for i in range(cfg.num_hidden_layers))
            cfg = dataclasses.replace(cfg, layer_types=layer_types)
        bad = [t for t in layer_types if t not in LAYER_TYPES]
        if bad or len(layer_types) != cfg.num_hidden_layers:
            raise ValueError(f"Gemma2 layer_types must hold {cfg.num_hidden_layers} entries of "
                             f"{LAYER_TYPES}, got {list(layer_types)}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"Gemma2: {cfg.num_attention_heads} attention heads do not split "
                             f"into {cfg.num_key_value_heads} key/value heads")
        activation(cfg.hidden_activation)  # fails early on an unsupported activation
        return cfg


class GemmaRMSNorm(nnx.Module):
    """x / rms(x) * (1 + w), computed in fp32, returned in x's dtype (w starts at zero)."""

    def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
        self.eps = eps
        self.scale = param(jnp.zeros((dim,), param_dtype), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.eps)
        return (h * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def rope_tables(cfg: Gemma2Config, seq_len: int) -> tuple[jax.Array, jax.Array]:
    """(cos, sin), each (S, head_dim) fp32: rotate-half layout, frequencies repeated twice."""
    d = cfg.head_dim
    inv_freq = np.float32(1.0) / (np.float32(cfg.rope_theta)
                                  ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq)[None]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (B, S, N, D); cos/sin (S, D) already in x's dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def attention_masks(cfg: Gemma2Config, attention_mask: jax.Array | None, batch: int,
                    seq_len: int) -> dict[str, jax.Array]:
    """layer type -> (B, 1, 1, S, S) bool, True where query q may read key k: causal, inside the
    sliding window (k > q - window) for sliding layers, and the key is not padding."""
    q = np.arange(seq_len)[:, None]
    k = np.arange(seq_len)[None, :]
    causal = k <= q
    keep = (jnp.ones((batch, seq_len), bool) if attention_mask is None
            else attention_mask.astype(bool))[:, None, None, None, :]
    out = {"full_attention": jnp.asarray(causal)[None, None, None] & keep}
    window = cfg.sliding_window
    sliding = causal if window is None else causal & (k > q - window)
    out["sliding_attention"] = jnp.asarray(sliding)[None, None, None] & keep
    return out


class Gemma2Attention(nnx.Module):
    def __init__(self, cfg: Gemma2Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        self.scaling = float(cfg.query_pre_attn_scalar) ** -0.5
        self.softcap = cfg.attn_logit_softcapping
        kw = dict(rngs=rngs, bias=cfg.attention_bias, dtype=dtype, param_dtype=param_dtype)
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = Linear(d, self.heads * hd, axes=("embed", "heads"), **kw)
        self.k_proj = Linear(d, self.kv_heads * hd, axes=("embed", "heads"), **kw)
        self.v_proj = Linear(d, self.kv_heads * hd, axes=("embed", "heads"), **kw)
        self.o_proj = Linear(self.heads * hd, d, axes=("heads", "embed"), **kw)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 allowed: jax.Array) -> jax.Array:
        """x (B, S, D); allowed (B, 1, 1, S, S) bool."""
        b, s, _ = x.shape
        groups = self.heads // self.kv_heads
        q = self.q_proj(x).reshape(b, s, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(b, s, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, s, self.kv_heads, self.head_dim)
        cos, sin = cos.astype(q.dtype), sin.astype(q.dtype)  # transformers casts them to x's dtype
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = q.reshape(b, s, self.kv_heads, groups, self.head_dim)  # head h = kv * groups + g
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) * self.scaling
        if self.softcap is not None:
            scores = jnp.tanh(scores / self.softcap) * self.softcap
        # transformers adds the dtype's most negative value: a fully masked row becomes uniform
        scores = scores + jnp.where(allowed, 0.0, jnp.finfo(scores.dtype).min).astype(scores.dtype)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, -1)
        return self.o_proj(out)


class Gemma2MLP(nnx.Module):
    def __init__(self, cfg: Gemma2Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.act = activation(cfg.hidden_activation)
        self.gate_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.up_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.down_proj = Linear(f, d, axes=("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Gemma2Layer(nnx.Module):
    def __init__(self, cfg: Gemma2Config, layer_type: str, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        norm = dict(eps=cfg.rms_norm_eps, param_dtype=param_dtype)
        self.layer_type = layer_type
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, **norm)
        self.self_attn = Gemma2Attention(cfg, **kw)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, **norm)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, **norm)
        self.mlp = Gemma2MLP(cfg, **kw)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, **norm)

    def __call__(self, x, cos, sin, allowed):
        h = self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        x = x + self.post_attention_layernorm(h)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return constrain(x, ACT_AXES)


class Gemma2Model(nnx.Module):
    """Port of transformers' Gemma2Model; returns last_hidden_state (final norm applied)."""

    def __init__(self, cfg: Gemma2Config, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        self.cfg = cfg
        self.dtype = dtype
        self.embed_tokens = param(nnx.initializers.normal(0.02)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size), param_dtype), ("vocab", "embed"))
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        assert cfg.layer_types is not None  # from_dict fills it
        self.layers = nnx.List([Gemma2Layer(cfg, t, **kw) for t in cfg.layer_types])
        self.norm = GemmaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=param_dtype)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """input_ids (B, S) int; attention_mask (B, S) (1 = token, 0 = padding) or None.
        Returns (B, S, hidden_size) in the compute dtype."""
        table = self.embed_tokens[...]
        scale = jnp.asarray(self.cfg.hidden_size ** 0.5, jnp.float32).astype(table.dtype)
        x = jnp.take(table, input_ids, axis=0) * scale
        x = constrain(x.astype(self.dtype or table.dtype), ACT_AXES)
        b, s = input_ids.shape
        cos, sin = rope_tables(self.cfg, s)
        masks = attention_masks(self.cfg, attention_mask, b, s)
        for layer in self.layers:
            x = layer(x, cos, sin, masks[layer.layer_type])
        return self.norm(x)


def select_sana_tokens(hidden: jax.Array, attention_mask: jax.Array,
                       max_sequence_length: int) -> tuple[jax.Array, jax.Array]:
    """SanaPipeline.encode_prompt's token selection: the first token (BOS) and the last
    max_sequence_length - 1 tokens of the encoded (CHI-prefixed) prompt, mask alike."""
    if hidden.shape[1] < max_sequence_length:
        raise ValueError(f"SANA selects {max_sequence_length} tokens but the prompt was encoded "
                         f"to {hidden.shape[1]}")
    index = np.array([0] + list(range(hidden.shape[1] - max_sequence_length + 1,
                                      hidden.shape[1])))
    return hidden[:, index], attention_mask[:, index]


def make_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs) -> Gemma2Model:
    return Gemma2Model(Gemma2Config.from_dict(config), rngs=rngs, dtype=dtype,
                       param_dtype=param_dtype)
