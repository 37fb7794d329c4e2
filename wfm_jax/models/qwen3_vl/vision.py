"""Qwen3-VL vision tower (transformers' Qwen3VLVisionModel) in Flax NNX.

Input `pixel_values` is already patchified, (N, C*Tp*P*P), patches of each frame pair ordered in
2x2 merge blocks. The per-image layout (position-embedding interpolation taps, rotary (row, col)
ids, attention segments) depends only on `grid_thw`, so it is computed on the host in numpy
(`vision_layout`) and `grid_thw` must be concrete (static under jit).

Attention is bidirectional within each temporal patch of each image/video only. When every
segment has the same length (one video, or images of one size) it runs as a batch of per-segment
attentions; otherwise as one dense attention over all N patches masked by segment ids (exact, but
N x N scores: mixed sizes of very many patches would want a segment-blocked kernel).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.norms import LayerNorm
from wfm_jax.models.layers.remat import check_remat, checkpointed
from wfm_jax.models.qwen3_vl.config import VisionConfig
from wfm_jax.models.text.activations import activation


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear, align_corners=True, border-clamped taps of one axis, in float32 as transformers'
    `_interpolation_axis_taps_weights` computes them."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(np.float32)
    floor = np.floor(src)
    offsets = np.arange(2, dtype=np.float32)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    dist = np.abs(src[:, None] - floor[:, None] - offsets)
    return taps, np.maximum(np.float32(1) - dist, 0).astype(np.float32)


def vision_layout(grid_thw, cfg: VisionConfig) -> dict[str, np.ndarray]:
    """Host-side per-patch tables for `grid_thw` (n, 3) (t, h, w in patches):

    interp_idx/interp_w (N, 4): position-embedding taps and weights; rope_pos (N, 2): (row, col)
    of each patch; segment (N,): attention segment (one per temporal patch of each entry).
    Patches are enumerated in merge-block order (block_row, block_col, in_row, in_col), t times.
    """
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    m, side = cfg.spatial_merge_size, round(cfg.num_position_embeddings ** 0.5)
    if (grid <= 0).any() or (grid[:, 1:] % m).any():
        raise ValueError(f"grid_thw {grid.tolist()}: every t, h, w must be positive and h, w "
                         f"multiples of spatial_merge_size {m}")
    rows, cols, heights, widths, segment = [], [], [], [], []
    seg = 0
    for t, h, w in grid.tolist():
        r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        def block(a, h=h, w=w):
            return a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
        rows.append(np.tile(block(r), t))
        cols.append(np.tile(block(c), t))
        heights.append(np.full(t * h * w, h))
        widths.append(np.full(t * h * w, w))
        segment.append(np.repeat(np.arange(seg, seg + t), h * w))
        seg += t
    row, col = np.concatenate(rows), np.concatenate(cols)
    h_taps, h_w = _axis_taps(row, np.concatenate(heights), side)
    w_taps, w_w = _axis_taps(col, np.concatenate(widths), side)
    return {"interp_idx": (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4),
            "interp_w": (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4),
            "rope_pos": np.stack([row, col], axis=-1),
            "segment": np.concatenate(segment)}


def vision_rope(rope_pos: np.ndarray, cfg: VisionConfig) -> tuple[jax.Array, jax.Array]:
    """(N, head_dim) fp32 cos/sin of the axial 2-D RoPE: freqs = cat(row*inv, col*inv), twice."""
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    freqs = jnp.asarray(rope_pos, jnp.float32)[..., None] * inv  # (N, 2, hd/4)
    freqs = freqs.reshape(freqs.shape[0], -1)  # row block then col block
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class VisionAttention(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.qkv = Linear(d, 3 * d, axes=("embed", "heads"), **kw)
        self.proj = Linear(d, d, axes=("heads", "embed"), **kw)

    def __call__(self, x, cos, sin, allowed, seg_len=None):
        """allowed (N, N) bool, or None with seg_len: every segment seg_len long (attention
        then runs per segment, no N x N scores)."""
        n = x.shape[0]
        qkv = self.qkv(x).reshape(n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        def rot(t):
            return (t.astype(jnp.float32) * cos[:, None] + _rotate_half(
                    t.astype(jnp.float32)) * sin[:, None]).astype(t.dtype)  # RoPE in fp32, as transformers
        q, k = rot(q), rot(k)
        if allowed is None:  # equal segments: a batch of independent attentions
            q, k, v = (t.reshape(n // seg_len, seg_len, self.num_heads, self.head_dim) for t in (q, k, v))
            scores = jnp.einsum("sqhd,skhd->shqk", q, k).astype(jnp.float32) * self.head_dim ** -0.5
            weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
            return self.proj(jnp.einsum("shqk,skhd->sqhd", weights, v).reshape(n, -1))
        scores = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) * self.head_dim ** -0.5
        scores = jnp.where(allowed[None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.proj(jnp.einsum("hqk,khd->qhd", weights, v).reshape(n, -1))


class VisionMLP(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.act = activation(cfg.hidden_act)
        self.linear_fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, axes=("embed", "mlp"), **kw)
        self.linear_fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, axes=("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.norm1 = LayerNorm(cfg.hidden_size, eps=1e-6, param_dtype=param_dtype)
        self.norm2 = LayerNorm(cfg.hidden_size, eps=1e-6, param_dtype=param_dtype)
        self.attn = VisionAttention(cfg, **kw)
        self.mlp = VisionMLP(cfg, **kw)

    def __call__(self, x, cos, sin, allowed, seg_len=None):
        x = x + self.attn(self.norm1(x), cos, sin, allowed, seg_len)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """LN, then each 2x2 block of patches as one vector, fc2(GELU(fc1(.))). With
    `postshuffle_norm` (the DeepStack mergers) the LN runs over the merged vector instead."""

    def __init__(self, cfg: VisionConfig, *, postshuffle_norm: bool, rngs: nnx.Rngs, dtype,
                 param_dtype):
        self.merged = cfg.hidden_size * cfg.spatial_merge_size ** 2
        self.postshuffle_norm = postshuffle_norm
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.norm = LayerNorm(self.merged if postshuffle_norm else cfg.hidden_size, eps=1e-6,
                              param_dtype=param_dtype, axes=(None,))
        self.linear_fc1 = Linear(self.merged, self.merged, axes=(None, "mlp"), **kw)
        self.linear_fc2 = Linear(self.merged, cfg.out_hidden_size, axes=("mlp", "embed"), **kw)

    def __call__(self, x):
        if self.postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged))
        else:
            x = self.norm(x).reshape(-1, self.merged)
        return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class _Conv3dProj(nnx.Module):
    """Conv3d whose kernel equals its stride: one matmul per patch. The kernel keeps the conv
    layout (t, h, w, in, out) so the converter's `conv` transform maps it."""

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, param_dtype):
        shape = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size, cfg.in_channels,
                 cfg.hidden_size)
        self.kernel = param(nnx.initializers.lecun_normal()(rngs.params(), shape, param_dtype),
                            (None, None, None, None, "embed"))
        self.bias = param(jnp.zeros((cfg.hidden_size,), param_dtype), ("embed",))


class PatchEmbed(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, param_dtype):
        self.proj = _Conv3dProj(cfg, rngs=rngs, param_dtype=param_dtype)


class Qwen3VLVisionModel(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32,
                 remat: str = "everything_saveable"):
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self.cfg, self.dtype, self.remat = cfg, dtype, remat
        d = cfg.hidden_size
        self.patch_embed = PatchEmbed(cfg, rngs=rngs, param_dtype=param_dtype)
        self.pos_embed = param(nnx.initializers.normal(0.02)(
            rngs.params(), (cfg.num_position_embeddings, d), param_dtype), (None, "embed"))
        kw = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.blocks = nnx.List([VisionBlock(cfg, **kw) for _ in range(cfg.depth)])
        self.merger = PatchMerger(cfg, postshuffle_norm=False, **kw)
        self.deepstack_merger_list = nnx.List([PatchMerger(cfg, postshuffle_norm=True, **kw)
                                               for _ in cfg.deepstack_visual_indexes])

    def embed_patches(self, pixel_values: jax.Array, layout: dict) -> jax.Array:
        cfg = self.cfg
        dtype = self.dtype or self.pos_embed[...].dtype
        if pixel_values.ndim != 2 or pixel_values.shape != (len(layout["segment"]), cfg.patch_dim):
            raise ValueError(f"pixel_values shape {tuple(pixel_values.shape)}: grid_thw needs "
                             f"({len(layout['segment'])}, {cfg.patch_dim})")
        p = pixel_values.reshape(-1, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size,
                                 cfg.patch_size).astype(dtype)
        proj = self.patch_embed.proj
        x = jnp.einsum("nctij,tijcd->nd", p, proj.kernel[...].astype(dtype)) + proj.bias[...].astype(
            dtype)
        taps = jnp.take(self.pos_embed[...], jnp.asarray(layout["interp_idx"]), axis=0)
        pos = jnp.sum(taps * jnp.asarray(layout["interp_w"])[:, :, None], axis=1)
        return x + pos.astype(dtype)

    def __call__(self, pixel_values: jax.Array, grid_thw) -> tuple[jax.Array, list[jax.Array]]:
        """pixel_values (N, C*Tp*P*P); grid_thw (n, 3) concrete. Returns the merged tokens
        (N/4, out_hidden_size) and the DeepStack features (one (N/4, out) per index)."""
        layout = vision_layout(grid_thw, self.cfg)
        x = self.embed_patches(pixel_values, layout)
        cos, sin = vision_rope(layout["rope_pos"], self.cfg)
        lengths = np.bincount(layout["segment"])
        seg_len = int(lengths[0]) if (lengths == lengths[0]).all() else None
        seg = jnp.asarray(layout["segment"])
        allowed = None if seg_len else seg[:, None] == seg[None, :]
        deepstack = []
        for i, block in enumerate(self.blocks):
            graphdef = nnx.graphdef(block)

            def run(state, x, cos, sin, allowed, graphdef=graphdef):
                return nnx.merge(graphdef, state)(x, cos, sin, allowed, seg_len)

            x = checkpointed(run, self.remat)(nnx.state(block), x, cos, sin, allowed)
            if i in self.cfg.deepstack_visual_indexes:
                j = self.cfg.deepstack_visual_indexes.index(i)
                deepstack.append(self.deepstack_merger_list[j](x))
        return self.merger(x), deepstack
