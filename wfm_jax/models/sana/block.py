"""The SANA transformer block (diffusers `SanaTransformerBlock`, and `SanaVideoTransformerBlock`
with `video=True`), with scale_shift_table (6, D) + the timestep projection as modulation:

1. LayerNorm (no affine), modulate, linear self-attention (+ RoPE for video), gated residual;
2. cross-attention to the caption with the text mask: no pre-norm, no gate;
3. norm2, modulate, GLUMBConv (GLUMBTempConv for video) on the token grid, gated residual.

Modulation and the residual sums are fp32 (the norms too); the modulation is (B, T, 6, D) with
T = 1 (one timestep per sample) or T = N (one per token, which diffusers' video model
broadcasts). The patch grid is static: the transformer passes it closed over in the function
layers.remat.run_blocks checkpoints (jax.checkpoint sees only traced arguments).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import param
from wfm_jax.models.layers.norms import LayerNorm
from wfm_jax.models.sana.cross_attention import SanaCrossAttention
from wfm_jax.models.sana.glumbconv import GLUMBConv, GLUMBTempConv
from wfm_jax.models.sana.linear_attention import SanaLinearAttention


def modulate(norm, x, shift, scale, dtype):
    """norm(x) * (1 + scale) + shift in fp32; shift, scale (B, T, D) broadcast over tokens."""
    return (norm(x.astype(jnp.float32)) * (1.0 + scale) + shift).astype(dtype)


def gated_residual(x, gate, y):
    return (x.astype(jnp.float32) + gate * y.astype(jnp.float32)).astype(x.dtype)


class SanaBlock(nnx.Module):
    def __init__(self, cfg: dict, *, video: bool, rngs: nnx.Rngs, dtype, param_dtype):
        heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
        dim = heads * head_dim
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.dtype = dtype
        self.norm1 = LayerNorm(dim, eps=cfg["norm_eps"], affine=False)
        self.attn1 = SanaLinearAttention(dim, heads, head_dim, bias=cfg["attention_bias"],
                                         qk_norm=cfg["qk_norm"], **kw)
        self.norm2 = LayerNorm(dim, eps=cfg["norm_eps"], affine=cfg["norm_elementwise_affine"],
                               param_dtype=param_dtype)
        self.attn2 = SanaCrossAttention(dim, cfg["cross_attention_dim"],
                                        cfg["num_cross_attention_heads"],
                                        cfg["cross_attention_head_dim"], qk_norm=cfg["qk_norm"],
                                        **kw)
        ff = GLUMBTempConv if video else GLUMBConv
        self.ff = ff(dim, cfg["mlp_ratio"], **kw)
        init = jax.random.normal(rngs.params(), (6, dim), param_dtype) / math.sqrt(dim)
        self.scale_shift_table = param(init, (None, "embed"))

    def __call__(self, x, context, bias, tproj, rope, *, grid):
        """x (B, N, D); context (B, L, D); bias (B, 1, 1, L) or None; tproj (B, T, 6, D) fp32;
        rope (cos, sin) or None; grid: the token grid ((h, w) or (f, h, w)), N its product."""
        mod = self.scale_shift_table[...].astype(jnp.float32) + tproj
        shift, scale, gate, c_shift, c_scale, c_gate = (mod[:, :, i] for i in range(6))
        x = gated_residual(x, gate, self.attn1(modulate(self.norm1, x, shift, scale, self.dtype),
                                               rope))
        x = x + self.attn2(x, context, bias).astype(x.dtype)
        h = modulate(self.norm2, x, c_shift, c_scale, self.dtype)
        h = self.ff(h.reshape(h.shape[0], *grid, h.shape[-1]))
        return gated_residual(x, c_gate, h.reshape(x.shape))
