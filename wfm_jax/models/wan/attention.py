"""Wan's attention (diffusers `WanAttention` + `WanAttnProcessor`): self- or cross-attention with
an RMS norm of q and k over all heads together ("rms_norm_across_heads") before the split into
heads, and the 3D RoPE on self-attention.

Module names follow diffusers (to_q, to_k, to_v, to_out.0, norm_q, norm_k) so checkpoints and
LoRA target names map one-to-one. The kernels are layers.attention's: dot_product_attention for
self-attention, cross_attention for the text (whose K/V every context shard keeps whole).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.attention import (
    check_context_parallel_impl,
    cross_attention,
    dot_product_attention,
    resolve_attention_impl,
)
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm
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

    def __call__(self, x, context=None, rope=None):
        """x (B, S, D); context (B, L, D) for cross-attention (None: self-attention);
        rope: (cos, sin) tables of rope.rope_tables for the S tokens, or None."""
        kv = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(kv), self.to_v(kv)
        q, k = self.norm_q(q), self.norm_k(k)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        attend = dot_product_attention if context is None else cross_attention
        out = attend(q, k, v, implementation=self.attention_impl,
                     context_parallel=self.context_parallel_impl)
        return self.to_out[0](out.reshape(*out.shape[:2], -1))
