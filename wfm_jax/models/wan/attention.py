"""Wan's attention (diffusers `WanAttention` + `WanAttnProcessor`): self- or cross-attention with
an RMS norm of q and k over all heads together ("rms_norm_across_heads") before the split into
heads, and the 3D RoPE on self-attention.

Module names follow diffusers (to_q, to_k, to_v, to_out.0, norm_q, norm_k) so checkpoints and
LoRA target names map one-to-one. The kernels are layers.attention's: dot_product_attention for
self-attention, cross_attention for the text (whose K/V every context shard keeps whole). On the
Pallas path with the sequence unsplit, q, k and v are projected straight into the kernel's
(B, N, T, H) layout and the output projection contracts it, as SD3's attention does
(layers/attention.py `runs_heads_first`), so no transpose surrounds the kernel.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.attention import (
    check_context_parallel_impl,
    cross_attention,
    dot_product_attention,
    from_heads,
    heads_first_kernel,
    into_heads,
    resolve_attention_impl,
    runs_heads_first,
)
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm, rms_norm_over_heads
from wfm_jax.models.wan.rope import apply_rope


class WanAttention(nnx.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6,
                 dtype=None, param_dtype=jnp.float32, attention_impl="xla",
                 context_parallel_impl="auto"):
        self.heads, self.head_dim = heads, head_dim
        check_context_parallel_impl(context_parallel_impl)
        self.context_parallel_impl = context_parallel_impl
        self.attention_impl = resolve_attention_impl(attention_impl, dtype or param_dtype,
                                                     head_dim)
        inner = heads * head_dim
        lin = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.to_q = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_k = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_v = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_out = nnx.List([Linear(inner, dim, axes=("heads", "embed"), **lin)])
        norm = dict(eps=eps, param_dtype=param_dtype, axes=("heads",))
        # diffusers builds these whatever config.qk_norm says
        self.norm_q = RMSNorm(inner, **norm)
        self.norm_k = RMSNorm(inner, **norm)

    def _heads(self, x):
        return x.reshape(*x.shape[:2], self.heads, self.head_dim)

    def _call_heads_first(self, x, kv, rope):
        """The Pallas kernel with the sequence unsplit, in its own (B, N, T, H) layout
        (layers/attention.py `runs_heads_first`); q and k RMS-normed over all heads there."""
        n, h = self.heads, self.head_dim
        q, k, v = (into_heads(lin, a, n, h) for lin, a in ((self.to_q, x), (self.to_k, kv), (self.to_v, kv)))
        q, k = (rms_norm_over_heads(t, norm.scale[...], norm.eps)
                for t, norm in ((q, self.norm_q), (k, self.norm_k)))
        if rope is not None:
            q, k = (apply_rope(t, *rope, heads_first=True) for t in (q, k))
        return from_heads(self.to_out[0], heads_first_kernel(q, k, v), n, h)

    def __call__(self, x, context=None, rope=None):
        """x (B, S, D); context (B, L, D) for cross-attention (None: self-attention);
        rope: (cos, sin) tables of rope.rope_tables for the S tokens, or None."""
        kv = x if context is None else context
        if runs_heads_first(self.attention_impl, x.dtype, self.heads, self.head_dim,
                            max(x.shape[1], kv.shape[1])):
            return self._call_heads_first(x, kv, rope)
        q, k, v = self.to_q(x), self.to_k(kv), self.to_v(kv)
        q, k = self.norm_q(q), self.norm_k(k)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        attend = dot_product_attention if context is None else cross_attention
        out = attend(q, k, v, implementation=self.attention_impl,
                     context_parallel=self.context_parallel_impl)
        return self.to_out[0](out.reshape(*out.shape[:2], -1))
