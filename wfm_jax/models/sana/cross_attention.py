"""SANA's cross-attention to the caption (diffusers `Attention` + `SanaAttnProcessor2_0`):
softmax attention with biased q/k/v, an optional RMS norm of q and k across heads, and the text
mask added to the scores as diffusers adds it, (1 - mask) * -10000 (not -inf: a fully padded
caption still attends uniformly, as in diffusers). No pre-norm and no gate: the block adds the
output to the residual stream as it is.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.layers.attention import QKV_AXES
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm
from wfm_jax.models.sana.linear_attention import QK_NORM_EPS

MASK_BIAS = -10000.0  # diffusers' "discard" value


def mask_bias(mask, batch: int, length: int):
    """(B, L) keep-mask (1 / True keep, 0 / False drop) -> (B, 1, 1, L) fp32 score bias; None
    stays None. Anything else is refused in one line."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.shape != (batch, length):
        raise ValueError(f"encoder_attention_mask must be (batch, text_len) = ({batch}, {length}), "
                         f"got shape {tuple(mask.shape)}")
    return ((1.0 - mask.astype(jnp.float32)) * MASK_BIAS)[:, None, None, :]


class SanaCrossAttention(nnx.Module):
    """q from the tokens (dim), k and v from the caption (context_dim); heads x head_dim inner."""

    def __init__(self, dim: int, context_dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs,
                 qk_norm: str | None, out_bias: bool = True, dtype=None,
                 param_dtype=jnp.float32):
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        lin = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.to_q = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_k = Linear(context_dim, inner, axes=("embed", "heads"), **lin)
        self.to_v = Linear(context_dim, inner, axes=("embed", "heads"), **lin)
        self.to_out = nnx.List([Linear(inner, dim, bias=out_bias, axes=("heads", "embed"), **lin)])
        norm = dict(eps=QK_NORM_EPS, param_dtype=param_dtype, axes=("heads",))
        self.norm_q = RMSNorm(inner, **norm) if qk_norm else None
        self.norm_k = RMSNorm(inner, **norm) if qk_norm else None

    def _heads(self, x):
        return mesh.constrain(x.reshape(*x.shape[:2], self.heads, self.head_dim), QKV_AXES)

    def __call__(self, x, context, bias=None):
        """x (B, N, D), context (B, L, context_dim), bias (B, 1, 1, L) from `mask_bias` or None."""
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        if self.norm_q is not None:
            q, k = self.norm_q(q), self.norm_k(k)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if bias is not None:
            bias = bias.astype(q.dtype)
        out = jax.nn.dot_product_attention(q, k, v, bias=bias, implementation="xla")
        out = mesh.constrain(out, QKV_AXES)
        return self.to_out[0](out.reshape(*x.shape[:2], -1))
