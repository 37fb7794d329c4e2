"""Wan2.1 text-to-video DiT (diffusers `WanTransformer3DModel`) in Flax NNX.

Built from the diffusers config.json dict. Covers the T2V models (1.3B, 14B: WAN21_T2V_1_3B,
WAN21_T2V_14B below); the image-conditioned variants (image_dim / added_kv_proj_dim) and
per-token timesteps (Wan2.2 TI2V) are refused by name. Precision: the residual stream and the
projections run in the compute dtype; norms, the time embedding, modulation (scale_shift_table
+ time projection) and the gated residual sums in fp32, the fp32 islands diffusers keeps
(`_keep_in_fp32_modules`) and maxdiffusion found needed for 720p quality.
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.layers.attention import check_attention_impl
from wfm_jax.models.layers.feedforward import FeedForward
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.modulation import gated_residual, modulate
from wfm_jax.models.layers.norms import LayerNorm, traced_with_norm_checkpoints
from wfm_jax.models.layers.remat import check_remat, run_blocks
from wfm_jax.models.wan.attention import WanAttention
from wfm_jax.models.wan.embeddings import PatchEmbed3D, WanConditionEmbedder
from wfm_jax.models.wan.rope import rope_tables

# diffusers WanTransformer3DModel.__init__ defaults
DEFAULTS = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
                in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824,
                num_layers=40, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024,
                pos_embed_seq_len=None)
# The released configs (diffusers' convert_wan_to_diffusers.py; spec video_models.md §1.2).
WAN21_T2V_1_3B = dict(DEFAULTS, num_attention_heads=12, ffn_dim=8960, num_layers=30)
WAN21_T2V_14B = dict(DEFAULTS, num_attention_heads=40, ffn_dim=13824, num_layers=40)

TOKEN_AXES = ("act_batch", "act_seq", "act_embed")
_UNSUPPORTED = ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len")


def wan_config(config: dict) -> dict:
    """diffusers config.json dict -> complete config (defaults filled in, unknown keys warned)."""
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        warnings.warn(f"WanTransformer3DModel config: ignoring unknown keys {unknown}",
                      stacklevel=2)
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if k in DEFAULTS}}
    cfg["patch_size"] = tuple(cfg["patch_size"])
    cfg["out_channels"] = cfg["out_channels"] or cfg["in_channels"]
    used = [k for k in _UNSUPPORTED if cfg[k] is not None]
    if used:
        raise ValueError(f"WanTransformer3DModel with {', '.join(used)} (image-to-video) is not "
                         "supported; only text-to-video configs are")
    return cfg


class WanTransformerBlock(nnx.Module):
    """diffusers WanTransformerBlock: modulated self-attention with RoPE, cross-attention to the
    text (affine LayerNorm, no gate, no mask), modulated tanh-GELU FFN."""

    def __init__(self, dim: int, ffn_dim: int, heads: int, *, rngs: nnx.Rngs, eps: float,
                 cross_attn_norm: bool, dtype, param_dtype, attention_impl,
                 context_parallel_impl="auto"):
        self.dtype = dtype
        attn = dict(rngs=rngs, eps=eps, dtype=dtype, param_dtype=param_dtype,
                    attention_impl=attention_impl, context_parallel_impl=context_parallel_impl)
        self.norm1 = LayerNorm(dim, eps=eps, affine=False)
        self.attn1 = WanAttention(dim, heads, dim // heads, **attn)
        self.attn2 = WanAttention(dim, heads, dim // heads, **attn)
        self.norm2 = LayerNorm(dim, eps=eps, param_dtype=param_dtype) if cross_attn_norm else None
        self.ffn = FeedForward(dim, inner=ffn_dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm3 = LayerNorm(dim, eps=eps, affine=False)
        init = jax.random.normal(rngs.params(), (1, 6, dim), param_dtype) / math.sqrt(dim)
        self.scale_shift_table = param(init, (None, None, "embed"))

    def __call__(self, x, context, tproj, rope):
        """x (B, S, D), context (B, L, D), tproj (B, 6, D) fp32, rope (cos, sin)."""
        mod = self.scale_shift_table[...].astype(jnp.float32) + tproj
        shift, scale, gate, c_shift, c_scale, c_gate = (mod[:, i] for i in range(6))
        x = gated_residual(x, gate, self.attn1(modulate(self.norm1, x, shift, scale, self.dtype),
                                               rope=rope))
        normed = x if self.norm2 is None else self.norm2(x.astype(jnp.float32)).astype(self.dtype)
        x = x + self.attn2(normed, context).astype(x.dtype)
        ffn_in = modulate(self.norm3, x, c_shift, c_scale, self.dtype)
        return gated_residual(x, c_gate, self.ffn(ffn_in))


class WanTransformer(nnx.Module):
    """Wan velocity model; call layout and meaning identical to the diffusers forward.

    dtype: compute dtype (None: param_dtype); param_dtype: master weight dtype.
    attention_impl: "xla", "cudnn", "auto" or None, as for the SD3 model.
    context_parallel_impl: "auto" | "ulysses" | "ring" for the self-attention when a mesh splits
    the tokens over `context`; the cross-attention keeps the text K/V whole on every shard.
    remat: a layers.remat.REMAT_POLICIES name, per block; scan_layers: run the (identical)
    blocks as one lax.scan over their stacked weights (same parameters either way).
    Parameter paths are diffusers module names ("blocks.3.attn1.to_q.kernel").
    """

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 attention_impl="xla", remat: str = "everything_saveable", context_parallel_impl="auto",
                 scan_layers: bool = False, norm_checkpoints: bool = True):
        cfg = wan_config(config)
        self._config_items = tuple(sorted(cfg.items()))  # hashable: part of the static graph
        self.dtype = jnp.dtype(dtype or param_dtype)
        check_attention_impl(attention_impl, self.dtype)
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self.remat, self.scan_layers = remat, bool(scan_layers)
        self.norm_checkpoints = bool(norm_checkpoints)  # layers/norms.py
        heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
        dim = heads * head_dim
        self.head_dim, self.patch_size = head_dim, cfg["patch_size"]
        self.out_channels, self.rope_max_seq_len = cfg["out_channels"], cfg["rope_max_seq_len"]
        kw = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        self.patch_embedding = PatchEmbed3D(self.patch_size, cfg["in_channels"], dim, **kw)
        self.condition_embedder = WanConditionEmbedder(dim, cfg["freq_dim"], cfg["text_dim"], **kw)
        self.blocks = nnx.List([
            WanTransformerBlock(dim, cfg["ffn_dim"], heads, eps=cfg["eps"],
                                cross_attn_norm=cfg["cross_attn_norm"],
                                attention_impl=attention_impl,
                                context_parallel_impl=context_parallel_impl, **kw)
            for _ in range(cfg["num_layers"])])
        self.norm_out = LayerNorm(dim, eps=cfg["eps"], affine=False)
        self.proj_out = Linear(dim, self.out_channels * math.prod(self.patch_size),
                               axes=("embed", None), **kw)
        init = jax.random.normal(rngs.params(), (1, 2, dim), param_dtype) / math.sqrt(dim)
        self.scale_shift_table = param(init, (None, None, "embed"))

    @property
    def config(self) -> dict:
        return dict(self._config_items)

    @traced_with_norm_checkpoints
    def __call__(self, hidden_states, timestep, encoder_hidden_states):
        """(B, C, T, H, W) latents, (B,) timesteps (~1000 sigma), (B, L, text_dim) UMT5 states
        -> (B, C_out, T, H, W) velocity in the compute dtype."""
        b = hidden_states.shape[0]
        x, grid = self.patch_embedding(hidden_states.astype(self.dtype))
        x = mesh.constrain(x, TOKEN_AXES)
        cos, sin = rope_tables(self.head_dim, grid, self.rope_max_seq_len)
        rope = (jnp.asarray(cos), jnp.asarray(sin))
        t = jnp.broadcast_to(jnp.asarray(timestep, jnp.float32).reshape(-1), (b,))
        temb, tproj, context = self.condition_embedder(t, encoder_hidden_states.astype(self.dtype))
        context = mesh.constrain(context, TOKEN_AXES)
        x = run_blocks(self.blocks, x,
                       lambda block, x: mesh.constrain(block(x, context, tproj, rope), TOKEN_AXES),
                       remat=self.remat, scan_layers=self.scan_layers)
        mod = self.scale_shift_table[...].astype(jnp.float32) + temb[:, None]
        x = self.proj_out(modulate(self.norm_out, x, mod[:, 0], mod[:, 1], self.dtype))
        (f, h, w), (pt, ph, pw) = grid, self.patch_size
        x = x.reshape(b, f, h, w, pt, ph, pw, self.out_channels)
        x = jnp.einsum("bfhwtpqc->bcfthpwq", x)
        return x.reshape(b, self.out_channels, f * pt, h * ph, w * pw)
