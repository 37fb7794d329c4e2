"""Cosmos's attention (diffusers `Attention` + `CosmosAttnProcessor2_0`): self- or
cross-attention, no biases, a per-head RMS norm of q and k (eps 1e-5, width head_dim) and then,
on self-attention, the rotate-half 3D RoPE.

Module names follow diffusers (to_q, to_k, to_v, to_out.0, norm_q, norm_k), so checkpoints and
LoRA target names map one-to-one. The kernel is layers.attention.dot_product_attention; on the
Pallas path with the sequence unsplit q, k and v are projected straight into the kernel's
(B, N, T, H) layout and the output projection contracts it (layers/attention.py
`runs_heads_first`), so no transpose surrounds the kernel.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.cosmos.rope import apply_rope
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
from wfm_jax.models.layers.norms import RMSNorm

QK_NORM_EPS = 1e-5  # diffusers Attention's default eps, which Cosmos keeps


class CosmosAttention(nnx.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs,
                 context_dim: int | None = None, dtype=None, param_dtype=jnp.float32,
                 attention_impl="xla", context_parallel_impl="auto"):
        check_context_parallel_impl(context_parallel_impl)
        self.context_parallel_impl = context_parallel_impl
        self.heads, self.head_dim = heads, head_dim
        self.attention_impl = resolve_attention_impl(attention_impl, dtype or param_dtype,
                                                     head_dim)
        inner, kv_in = heads * head_dim, context_dim or dim
        lin = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        self.to_q = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_k = Linear(kv_in, inner, axes=("embed", "heads"), **lin)
        self.to_v = Linear(kv_in, inner, axes=("embed", "heads"), **lin)
        self.to_out = nnx.List([Linear(inner, dim, axes=("heads", "embed"), **lin)])
        self.norm_q = RMSNorm(head_dim, eps=QK_NORM_EPS, param_dtype=param_dtype)
        self.norm_k = RMSNorm(head_dim, eps=QK_NORM_EPS, param_dtype=param_dtype)

    def _heads(self, x):
        return x.reshape(*x.shape[:2], self.heads, self.head_dim)

    def _call_heads_first(self, x, kv, rope):
        """The Pallas kernel with the sequence unsplit, in its own (B, N, T, H) layout; the
        per-head norms and the RoPE work on the last axis in either layout."""
        n, h = self.heads, self.head_dim
        q, k, v = (into_heads(lin, a, n, h) for lin, a in ((self.to_q, x), (self.to_k, kv), (self.to_v, kv)))
        q, k = self.norm_q(q), self.norm_k(k)
        if rope is not None:
            q, k = (apply_rope(t, *rope, heads_first=True) for t in (q, k))
        return from_heads(self.to_out[0], heads_first_kernel(q, k, v), n, h)

    def __call__(self, x, context=None, rope=None):
        """x (B, S, D); context (B, L, context_dim) for cross-attention (None: self-attention);
        rope: (cos, sin) tables of rope.rope_tables for the S tokens, or None."""
        kv = x if context is None else context
        if runs_heads_first(self.attention_impl, x.dtype, self.heads, self.head_dim,
                            max(x.shape[1], kv.shape[1])):
            return self._call_heads_first(x, kv, rope)
        q, k, v = self._heads(self.to_q(x)), self._heads(self.to_k(kv)), self._heads(self.to_v(kv))
        q, k = self.norm_q(q), self.norm_k(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if context is None:  # the sequence may be split over `context`: Ulysses or the ring
            out = dot_product_attention(q, k, v, implementation=self.attention_impl,
                                        context_parallel=self.context_parallel_impl)
        else:  # every shard holds the whole text: each attends its own queries
            out = cross_attention(q, k, v, implementation=self.attention_impl,
                                  context_parallel=self.context_parallel_impl)
        return self.to_out[0](out.reshape(*out.shape[:2], -1))
