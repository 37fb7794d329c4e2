"""MMDiT building blocks: AdaLN modulation layers and the joint transformer block (the
feed-forward and the modulate / gated-residual helpers are shared: layers/feedforward.py,
layers/modulation.py).

Names mirror diffusers (norm1.linear, norm1_context, attn, attn2, ff.net.0.proj, ff.net.2,
ff_context, ...) so checkpoints and LoRA target names map one-to-one. Modulation (the SiLU +
linear on the conditioning vector, the LayerNorm, scale/shift and gates) runs in fp32; the
projections and the residual stream use the compute dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.attention import Attention
from wfm_jax.models.layers.feedforward import FeedForward
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.modulation import gated_residual, modulate
from wfm_jax.models.layers.norms import LayerNorm


class AdaLayerNorm(nnx.Module):
    """SiLU -> linear(dim, n*dim) on the conditioning, then a parameter-free LayerNorm(eps 1e-6).

    n = 6: AdaLayerNormZero (shift, scale, gate for attention and MLP);
    n = 9: SD35AdaLayerNormZeroX (plus shift, scale, gate of the second attention);
    n = 2: AdaLayerNormContinuous (scale, shift — in that order in diffusers).
    """

    def __init__(self, dim: int, chunks: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        self.chunks = chunks
        self.linear = Linear(dim, chunks * dim, axes=("embed", None), rngs=rngs, dtype=jnp.float32,
                             param_dtype=param_dtype)
        self.norm = LayerNorm(dim, eps=1e-6, affine=False)

    def emb(self, temb):
        return jnp.split(self.linear(jax.nn.silu(temb.astype(jnp.float32))), self.chunks, axis=1)


class AdaLayerNormContinuous(AdaLayerNorm):
    """diffusers AdaLayerNormContinuous(elementwise_affine=False, eps=1e-6) as SD3 uses it."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        super().__init__(dim, 2, rngs=rngs, param_dtype=param_dtype)

    def __call__(self, x, temb):
        scale, shift = self.emb(temb)  # diffusers chunks scale first, then shift
        return modulate(self.norm, x, shift, scale, x.dtype)


class JointTransformerBlock(nnx.Module):
    """diffusers JointTransformerBlock: joint attention of image and context tokens, AdaLN-zero.

    `context_pre_only` (the last block): the context stream only feeds the joint attention and is
    not returned. `use_dual_attention` (SD3.5 MMDiT-X): a second, image-only attention `attn2`
    modulated by the extra three chunks of SD35AdaLayerNormZeroX.
    """

    def __init__(self, dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs,
                 context_pre_only: bool = False, qk_norm: str | None = None,
                 use_dual_attention: bool = False, dtype=None, param_dtype=jnp.float32,
                 attention_impl="xla", context_parallel_impl="auto"):
        self.dtype = dtype
        self.context_pre_only = context_pre_only
        self.use_dual_attention = use_dual_attention
        ada = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = AdaLayerNorm(dim, 9 if use_dual_attention else 6, **ada)
        self.norm1_context = (AdaLayerNormContinuous(dim, **ada) if context_pre_only
                              else AdaLayerNorm(dim, 6, **ada))
        attn = dict(rngs=rngs, qk_norm=qk_norm, eps=1e-6, dtype=dtype, param_dtype=param_dtype,
                    attention_impl=attention_impl, context_parallel_impl=context_parallel_impl)
        self.attn = Attention(dim, heads, head_dim, added_kv_proj_dim=dim,
                              context_pre_only=context_pre_only, **attn)
        self.attn2 = Attention(dim, heads, head_dim, **attn) if use_dual_attention else None
        self.norm2 = LayerNorm(dim, eps=1e-6, affine=False)
        self.ff = FeedForward(dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm2_context = None if context_pre_only else LayerNorm(dim, eps=1e-6, affine=False)
        self.ff_context = (None if context_pre_only else
                           FeedForward(dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype))

    def __call__(self, hidden_states, encoder_hidden_states, temb):
        """Returns (encoder_hidden_states or None for the last block, hidden_states)."""
        x, c = hidden_states, encoder_hidden_states
        dtype = self.dtype or x.dtype
        mod = self.norm1.emb(temb)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod[:6]
        norm_x = modulate(self.norm1.norm, x, shift_msa, scale_msa, dtype)

        if self.context_pre_only:
            norm_c = self.norm1_context(c.astype(dtype), temb)
        else:
            c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = \
                self.norm1_context.emb(temb)
            norm_c = modulate(self.norm1_context.norm, c, c_shift_msa, c_scale_msa, dtype)

        attn_out, ctx_attn_out = self.attn(norm_x, norm_c)
        x = gated_residual(x, gate_msa, attn_out)

        if self.use_dual_attention:
            shift_msa2, scale_msa2, gate_msa2 = mod[6:]
            norm_x2 = modulate(self.norm1.norm, hidden_states, shift_msa2, scale_msa2, dtype)
            x = gated_residual(x, gate_msa2, self.attn2(norm_x2))

        x = gated_residual(x, gate_mlp, self.ff(modulate(self.norm2, x, shift_mlp, scale_mlp, dtype)))

        if self.context_pre_only:
            return None, x
        c = gated_residual(c, c_gate_msa, ctx_attn_out)
        ff_in = modulate(self.norm2_context, c, c_shift_mlp, c_scale_mlp, dtype)
        c = gated_residual(c, c_gate_mlp, self.ff_context(ff_in))
        return c, x
