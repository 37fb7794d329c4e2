"""Qwen3-VL text decoder (transformers' Qwen3VLTextModel, Qwen3 dense) in Flax NNX, with an
optional KV cache and scanned layers.

M-RoPE: position ids (3, B, L) = (T, H, W). Frequency slot i of the head_dim/2 slots rotates with
H if i % 3 == 1 and i < 3*section[1], with W if i % 3 == 2 and i < 3*section[2], else with T
(the interleaved layout). Pure text has three equal rows: ordinary 1-D RoPE.

The KV cache holds post-q/k-norm, post-RoPE keys, stacked over layers: k, v (layers, B, S, KV, hd).
Attention masks are built by the caller as `allowed` (B, 1, Lq, Lk) booleans.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.remat import check_remat, checkpointed, compute_state
from wfm_jax.models.qwen3_vl.config import TextConfig
from wfm_jax.models.text.activations import activation

ACT_AXES = ("act_batch", "act_seq", "act_embed")


def mrope_axis(cfg: TextConfig) -> np.ndarray:
    """(head_dim/2,) which of T (0), H (1), W (2) drives each frequency slot (interleaved)."""
    slots = np.arange(cfg.head_dim // 2)
    axis = np.zeros_like(slots)
    axis[(slots % 3 == 1) & (slots < 3 * cfg.mrope_section[1])] = 1
    axis[(slots % 3 == 2) & (slots < 3 * cfg.mrope_section[2])] = 2
    return axis


def mrope_cos_sin(position_ids: jax.Array, cfg: TextConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """position_ids (3, B, L) -> cos, sin (B, L, head_dim) in `dtype` (computed in fp32)."""
    exponent = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
    freqs = position_ids.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # (3, B, L, hd/2)
    axis = jnp.asarray(mrope_axis(cfg))
    freqs = jnp.where(axis == 0, freqs[0], jnp.where(axis == 1, freqs[1], freqs[2]))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RMSNorm(nnx.Module):
    """Qwen3 RMSNorm: normalise in fp32, cast to the input dtype, then scale."""

    def __init__(self, dim: int, *, eps: float, param_dtype, axes=("embed",)):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), axes)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * h.astype(x.dtype)


class TextAttention(nnx.Module):
    def __init__(self, cfg: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                            cfg.num_key_value_heads, hd)
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype, "bias": cfg.attention_bias}
        self.q_proj = Linear(d, self.num_heads * hd, axes=("embed", "heads"), **kw)
        self.k_proj = Linear(d, self.num_kv_heads * hd, axes=("embed", "heads"), **kw)
        self.v_proj = Linear(d, self.num_kv_heads * hd, axes=("embed", "heads"), **kw)
        self.o_proj = Linear(self.num_heads * hd, d, axes=("heads", "embed"), **kw)
        norm = {"eps": cfg.rms_norm_eps, "param_dtype": param_dtype, "axes": (None,)}
        self.q_norm = RMSNorm(hd, **norm)
        self.k_norm = RMSNorm(hd, **norm)

    def __call__(self, x, cos, sin, allowed, kv=None, index=None, layer=None):
        """x (B, L, D); cos/sin (B, L, hd); allowed (B, 1, L, Lk); kv: the stacked cache
        (k, v) each (layers, B, S, KV, hd), this layer's entries written in place at
        [layer, :, index:index+L] (one buffer through all layers and decode steps, no copies).
        Returns (out, kv)."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, s, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)

        def rot(t):
            return t * cos[:, :, None] + _rotate_half(t) * sin[:, :, None]

        q, k = rot(q), rot(k)
        if kv is not None:
            ck, cv = kv
            start = (layer, 0, index, 0, 0)
            ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), start)
            cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), start)
            kv = (ck, cv)
            k = jax.lax.dynamic_index_in_dim(ck, layer, keepdims=False).astype(q.dtype)
            v = jax.lax.dynamic_index_in_dim(cv, layer, keepdims=False).astype(q.dtype)
        groups = self.num_heads // self.num_kv_heads  # GQA: consecutive query heads share a kv head
        q = q.reshape(b, s, self.num_kv_heads, groups, self.head_dim)
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) * jnp.asarray(self.head_dim ** -0.5, q.dtype)
        scores = jnp.where(allowed[:, :, None], scores.astype(jnp.float32),
                           jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, -1)
        return self.o_proj(out), kv


class TextMLP(nnx.Module):
    def __init__(self, cfg: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = {"rngs": rngs, "bias": False, "dtype": dtype, "param_dtype": param_dtype}
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.act = activation(cfg.hidden_act)
        self.gate_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.up_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.down_proj = Linear(f, d, axes=("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = TextAttention(cfg, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps,
                                                param_dtype=param_dtype)
        self.mlp = TextMLP(cfg, **kw)

    def __call__(self, x, cos, sin, allowed, kv=None, index=None, layer=None):
        h, kv = self.self_attn(self.input_layernorm(x), cos, sin, allowed, kv, index, layer)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ACT_AXES), kv


class Qwen3VLTextModel(nnx.Module):
    def __init__(self, cfg: TextConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32,
                 remat: str = "everything_saveable", scan_layers: bool = False):
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self.cfg, self.dtype, self.remat, self.scan_layers = cfg, dtype, remat, scan_layers
        self.embed_tokens = param(nnx.initializers.normal(0.02)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size), param_dtype), ("vocab", "embed"))
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.layers = nnx.List([DecoderLayer(cfg, **kw) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=param_dtype)

    @property
    def compute_dtype(self):
        return self.dtype or self.embed_tokens[...].dtype

    def embed(self, input_ids: jax.Array) -> jax.Array:
        return jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(self.compute_dtype)

    def __call__(self, x, position_ids, allowed, deepstack=None, cache=None, index=None,
                 output_hidden_states: bool = False):
        """x (B, L, D) input embeddings; position_ids (3, B, L); allowed (B, 1, L, Lk);
        deepstack: None or (n, B, L, D), added to the output of layer j for j < n (zero away
        from visual tokens); cache: None or {"k", "v"} (layers, B, S, KV, hd), written at
        slot `index`.

        Returns (normed last hidden state, hidden states, new cache). hidden states is
        transformers' tuple when asked (the input of layer 0, each layer's output before the
        DeepStack add, the last replaced by the normed output), else None.
        """
        x = x0 = constrain(x.astype(self.compute_dtype), ACT_AXES)
        cos, sin = mrope_cos_sin(position_ids, self.cfg, x.dtype)
        n_ds = 0 if deepstack is None else deepstack.shape[0]

        def step(graphdef, state, carry, i, kv):
            out, kv = nnx.merge(graphdef, state)(carry, cos, sin, allowed, kv, index, i)
            nxt = out
            if n_ds:  # DeepStack: visual features join the outputs of the first n_ds layers
                add = jax.lax.dynamic_index_in_dim(deepstack, jnp.minimum(i, n_ds - 1), keepdims=False)
                nxt = out + jnp.where(i < n_ds, add, jnp.zeros_like(add)).astype(out.dtype)
            return nxt, out, kv

        n = len(self.layers)
        kv = None if cache is None else (cache["k"], cache["v"])
        if self.scan_layers and n > 1:
            # inside a scan XLA cannot CSE the recompute away: no barrier needed
            fn = checkpointed(functools.partial(step, nnx.graphdef(self.layers[0])), self.remat,
                              prevent_cse=False)
            stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[compute_state(lay) for lay in self.layers])

            def body(carry, xs):
                x, kv = carry
                state, i = xs
                x, out, kv = fn(state, x, i, kv)
                return (x, kv), (out if output_hidden_states else None)

            (x, kv), outs = jax.lax.scan(body, (x, kv), (stacked, jnp.arange(n)))
            outs = list(outs) if output_hidden_states else None
        else:
            outs = []
            for i, layer in enumerate(self.layers):
                fn = checkpointed(functools.partial(step, nnx.graphdef(layer)), self.remat)
                x, out, kv = fn(nnx.state(layer), x, jnp.asarray(i), kv)
                outs.append(out)
        normed = self.norm(x)  # after the last DeepStack add, as transformers
        hidden = (x0, *outs[:-1], normed) if output_hidden_states else None
        new_cache = None if cache is None or kv is None else {"k": kv[0], "v": kv[1]}
        return normed, hidden, new_cache
