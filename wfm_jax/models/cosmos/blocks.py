"""Cosmos's DiT block (diffusers `CosmosTransformerBlock`) and its adaLN-LoRA norms.

Modulation is per frame: the time embeddings arrive as (B, F, .) with F = 1 (one timestep per
sample) or F = the latent frame count (timestep [B, 1, T, 1, 1], every frame its own sigma), and
the token stream (B, F * Hp * Wp, D) is viewed as (B, F, Hp * Wp, D) to apply them. diffusers
expands them to every token and runs the adaLN-LoRA matmuls per token; the rows are identical,
so doing them per frame gives the same numbers for Hp * Wp times fewer FLOPs.
Norms, modulation and gated sums run in fp32 (design rule), everything else in the compute dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.cosmos.attention import CosmosAttention
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import LayerNorm


def _frames(x, frames: int):
    """(B, S, D) -> (B, F, S / F, D): tokens are row-major over (f, h, w)."""
    return x.reshape(x.shape[0], frames, -1, x.shape[-1])


def gated_residual(x, gate, y):
    """x + gate * y, gate (B, F, D) fp32, the sum in fp32, returned in x's dtype."""
    f = gate.shape[1]
    out = _frames(x, f).astype(jnp.float32) + gate[:, :, None] * _frames(y, f).astype(jnp.float32)
    return out.reshape(x.shape).astype(x.dtype)


class AdaLayerNormLoRA(nnx.Module):
    """diffusers CosmosAdaLayerNormZero (chunks=3: shift, scale, gate) and CosmosAdaLayerNorm
    (chunks=2, the output norm): linear_2(linear_1(SiLU(e))) + temb[..., :chunks * D], then
    LayerNorm (no affine, eps 1e-6) * (1 + scale) + shift."""

    def __init__(self, dim: int, lora_dim: int, chunks: int, *, rngs: nnx.Rngs,
                 param_dtype=jnp.float32):
        self.chunks = chunks
        kw = dict(rngs=rngs, bias=False, dtype=jnp.float32, param_dtype=param_dtype)
        self.linear_1 = Linear(dim, lora_dim, axes=("embed", None), **kw)
        self.linear_2 = Linear(lora_dim, chunks * dim, axes=(None, "embed"), **kw)
        self.norm = LayerNorm(dim, eps=1e-6, affine=False)

    def __call__(self, x, e, temb, dtype):
        """x (B, S, D); e (B, F, D) and temb (B, F, 3D) fp32 -> (modulated x in `dtype`,
        gate (B, F, D) fp32 or None for chunks=2)."""
        mod = self.linear_2(self.linear_1(jax.nn.silu(e)))
        # whole vectors per sample: linear_2's output is split over fsdp, and chunking a split
        # axis makes GSPMD replicate it anyway (with a warning); it is B * F * 3D floats
        mod = mesh.constrain(mod + temb[..., : mod.shape[-1]], ("act_batch", None, None))
        parts = jnp.split(mod, self.chunks, axis=-1)
        shift, scale = parts[0], parts[1]
        y = self.norm(_frames(x, e.shape[1]).astype(jnp.float32))
        y = (y * (1.0 + scale[:, :, None]) + shift[:, :, None]).reshape(x.shape).astype(dtype)
        return y, (parts[2] if self.chunks == 3 else None)


class _GELUProj(nnx.Module):
    """diffusers activations.GELU(approximate="none", bias=False): proj then exact GELU."""

    def __init__(self, dim: int, inner: int, **lin):
        self.proj = Linear(dim, inner, bias=False, axes=("embed", "mlp"), **lin)

    def __call__(self, x):
        return jax.nn.gelu(self.proj(x), approximate=False)


class _Identity(nnx.Module):
    """Stands where diffusers keeps a Dropout(0.0), so ff.net indices match (net.0, net.2)."""

    def __call__(self, x):
        return x


class FeedForward(nnx.Module):
    """diffusers FeedForward(dim, mult=mlp_ratio, activation_fn="gelu", bias=False)."""

    def __init__(self, dim: int, inner: int, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        lin = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.net = nnx.List([_GELUProj(dim, inner, **lin), _Identity(),
                             Linear(inner, dim, bias=False, axes=("mlp", "embed"), **lin)])

    def __call__(self, x):
        for layer in self.net:
            x = layer(x)
        return x


class CosmosTransformerBlock(nnx.Module):
    """x += g1 * SelfAttn(RoPE); x += g2 * CrossAttn(text); x += g3 * FFN, each input through
    its own adaLN-LoRA norm."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int, ffn_dim: int,
                 lora_dim: int, *, rngs: nnx.Rngs, dtype, param_dtype, attention_impl,
                 context_parallel_impl="auto"):
        self.dtype = dtype
        norm = dict(rngs=rngs, param_dtype=param_dtype)
        attn = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, attention_impl=attention_impl,
                    context_parallel_impl=context_parallel_impl)
        self.norm1 = AdaLayerNormLoRA(dim, lora_dim, 3, **norm)
        self.attn1 = CosmosAttention(dim, heads, head_dim, **attn)
        self.norm2 = AdaLayerNormLoRA(dim, lora_dim, 3, **norm)
        self.attn2 = CosmosAttention(dim, heads, head_dim, context_dim=context_dim, **attn)
        self.norm3 = AdaLayerNormLoRA(dim, lora_dim, 3, **norm)
        self.ff = FeedForward(dim, ffn_dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x, context, e, temb, rope):
        """x (B, S, D), context (B, L, context_dim), e (B, F, D) / temb (B, F, 3D) fp32,
        rope (cos, sin)."""
        y, gate = self.norm1(x, e, temb, self.dtype)
        x = gated_residual(x, gate, self.attn1(y, rope=rope))
        y, gate = self.norm2(x, e, temb, self.dtype)
        x = gated_residual(x, gate, self.attn2(y, context))
        y, gate = self.norm3(x, e, temb, self.dtype)
        return gated_residual(x, gate, self.ff(y))
