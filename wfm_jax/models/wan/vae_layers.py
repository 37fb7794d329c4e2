"""Building blocks of diffusers' AutoencoderKLWan (the Wan2.1 video VAE), channels-last.

Activations are (B, T, H, W, C). Every block that looks back in time takes a cache and returns the
new one, so a video can run chunk by chunk exactly as diffusers' `feat_cache` does it: a causal
conv keeps the last frames of its input and puts them in front of the next chunk. A cache of None
means no chunk has run yet: the history is then zeros, except in the temporal resamplers, which
follow diffusers' first-chunk rule (the downsampler passes its first frame through; the upsampler
skips its time conv, so the first latent frame becomes one frame, not two).

Every block also takes `first`, a traced bool, so that the first chunk can run in the same
program as every later one (`vae.run_scanned`): zero caches in, the chunk shaped like a later
one with its one real frame last, and where `first` holds, each causal conv zeroes the frames
before it (so it sees the zero history the first chunk alone sees, and keeps the history that
chunk leaves) and the resamplers pass it on instead of their time convs. The frames before it
are dropped at the end. Zeroing them costs no buffer; choosing each cache instead did (about
half a cache a conv on TPU at 480x832: docs/recipe_targets.md, "One decoder to compile").

Each class mirrors one diffusers module so the weight table maps one to one. Norms compute in fp32
whatever the compute dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import param
from wfm_jax.models.vae.blocks import CHANNELS, Conv2d, query_chunked_attention

HISTORY = 2  # diffusers' CACHE_T: frames of input a kernel-3 causal conv sees before a chunk


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _per_frame(fn, x: jax.Array) -> jax.Array:
    """Run a 2D (NHWC) function on every frame of (B, T, H, W, C)."""
    b, t = x.shape[:2]
    y = fn(x.reshape(b * t, *x.shape[2:]))
    return y.reshape(b, t, *y.shape[1:])


class CausalConv3d(nnx.Module):
    """WanCausalConv3d: the time axis is padded only in front (2 * padding_t frames), taken from
    the cache when there is one; space is padded symmetrically. Kernel is DHWIO."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, *, rngs: nnx.Rngs,
                 stride=1, padding=0, dtype=None, param_dtype=jnp.float32):
        kernel_size, stride, padding = _triple(kernel_size), _triple(stride), _triple(padding)
        self.history = 2 * padding[0]
        self.stride = stride
        self.padding = ((0, 0), (padding[1], padding[1]), (padding[2], padding[2]))
        self.dtype = dtype
        init = nnx.initializers.lecun_normal()
        self.kernel = param(init(rngs.params(), (*kernel_size, in_channels, out_channels),
                                 param_dtype), (None, None, None, "conv_in", "conv_out"))
        self.bias = param(jnp.zeros((out_channels,), param_dtype), CHANNELS)

    def __call__(self, x: jax.Array, cache: jax.Array | None = None, first=None):
        """x (B, T, H, W, C) -> (y, cache): the cache holds the last `history` input frames.
        Where `first` holds, every frame but the last counts as zeros."""
        if self.history:
            if cache is None:
                cache = jnp.zeros((x.shape[0], self.history, *x.shape[2:]), x.dtype)
            if first is not None:
                t = x.shape[1]
                keep = jnp.logical_or(jnp.logical_not(first), jnp.arange(t) == t - 1)
                x = jnp.where(keep[None, :, None, None, None], x, jnp.zeros((), x.dtype))
            x = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
            cache = x[:, -self.history:]
        dtype = self.dtype or x.dtype
        y = jax.lax.conv_general_dilated(
            x.astype(dtype), self.kernel[...].astype(dtype), window_strides=self.stride,
            padding=self.padding, dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        return y + self.bias[...].astype(dtype), cache


class ChannelRMSNorm(nnx.Module):
    """WanRMS_norm: F.normalize over channels (L2, eps 1e-12) * sqrt(C) * gamma; no bias."""

    def __init__(self, channels: int, *, param_dtype=jnp.float32):
        self.root = channels ** 0.5
        self.gamma = param(jnp.ones((channels,), param_dtype), CHANNELS)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(jnp.square(x32), axis=-1, keepdims=True))
        y = x32 / jnp.maximum(norm, 1e-12) * self.root * self.gamma[...].astype(jnp.float32)
        return y.astype(x.dtype)


class ResidualBlock(nnx.Module):
    """WanResidualBlock: norm -> SiLU -> causal 3x3x3 conv, twice, plus a (1x1x1) shortcut.
    Cache: (conv1's, conv2's)."""

    def __init__(self, in_channels: int, out_channels: int, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm1 = ChannelRMSNorm(in_channels, param_dtype=param_dtype)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, padding=1, **kw)
        self.norm2 = ChannelRMSNorm(out_channels, param_dtype=param_dtype)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, padding=1, **kw)
        self.conv_shortcut = (CausalConv3d(in_channels, out_channels, 1, **kw)
                              if in_channels != out_channels else None)

    def __call__(self, x: jax.Array, cache=None, first=None):
        c1, c2 = cache if cache is not None else (None, None)
        skip = self.conv_shortcut(x)[0] if self.conv_shortcut is not None else x
        h, c1 = self.conv1(jax.nn.silu(self.norm1(x)), c1, first)
        h, c2 = self.conv2(jax.nn.silu(self.norm2(h)), c2, first)  # dropout: inference only
        return h + skip.astype(h.dtype), (c1, c2)


class AttentionBlock(nnx.Module):
    """WanAttentionBlock: single-head self-attention over each frame's H*W positions (frames never
    attend to each other, so it needs no cache); 1x1 convs in and out, residual add."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.dtype = dtype
        self.norm = ChannelRMSNorm(channels, param_dtype=param_dtype)
        self.to_qkv = Conv2d(channels, 3 * channels, 1, **kw)
        self.proj = Conv2d(channels, channels, 1, **kw)

    def _frame(self, x: jax.Array) -> jax.Array:
        n, h, w, c = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(n, h * w, 1, 3 * c)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        out = query_chunked_attention(q, k, v).reshape(n, h, w, c)
        return x + self.proj(out).astype(x.dtype)

    def __call__(self, x: jax.Array, cache=None):
        return _per_frame(self._frame, x), None


class Resample(nnx.Module):
    """WanResample: x2 spatial up/down sampling per frame, and in the 3d modes x2 in time.

    upsample: nearest x2, 3x3 conv to `out_channels`; upsample3d first doubles the frames with a
    causal time conv (C -> 2C, the two halves interleaved as frames 2t, 2t+1). downsample: pad
    (right, bottom) by one, stride-2 3x3 conv; downsample3d then halves the frames with a stride-2
    time conv over (the previous chunk's last frame, this chunk).
    """

    MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")

    def __init__(self, channels: int, mode: str, *, out_channels: int | None = None,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        if mode not in self.MODES:
            raise ValueError(f"unknown resample mode {mode!r}; known: {', '.join(self.MODES)}")
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.mode = mode
        self.up = mode.startswith("up")
        if self.up:
            self.conv = Conv2d(channels, out_channels or channels // 2, 3, padding=1, **kw)
        else:
            self.conv = Conv2d(channels, channels, 3, stride=2, padding=((0, 1), (0, 1)), **kw)
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(channels, 2 * channels, (3, 1, 1), padding=(1, 0, 0),
                                          **kw)
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(channels, channels, (3, 1, 1), stride=(2, 1, 1), **kw)
        else:
            self.time_conv = None  # type: ignore[assignment]  # resample modes without a time conv

    def _spatial(self, x: jax.Array) -> jax.Array:
        if self.up:  # "nearest-exact" at an integer factor of 2 is plain repetition
            x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
        return self.conv(x)

    def __call__(self, x: jax.Array, cache=None, first=None):
        if self.mode == "upsample3d":
            if cache is None:  # first chunk: diffusers' "Rep" — no time conv, zero history after
                cache = jnp.zeros((x.shape[0], HISTORY, *x.shape[2:]), x.dtype)
            else:
                y, after = self.time_conv(x, cache)
                b, t, h, w, _ = y.shape
                y = y.reshape(b, t, h, w, 2, -1)
                y = jnp.moveaxis(y, 4, 2).reshape(b, 2 * t, h, w, -1)
                if first is not None:  # the first chunk's rule: its frame on, last in the shape
                    y = jnp.where(first, jnp.repeat(x, 2, axis=1).astype(y.dtype), y)
                    after = jnp.where(first, jnp.zeros_like(after), after)
                x, cache = y, after
        x = _per_frame(self._spatial, x)
        if self.mode == "downsample3d":
            if cache is None:  # first chunk: its frame passes through unchanged
                cache = x[:, -1:]
            else:
                y, _ = self.time_conv(jnp.concatenate([cache.astype(x.dtype), x], axis=1))
                if first is not None:  # the first chunk's rule: its frame on, last in the shape
                    y = jnp.where(first, jnp.repeat(x[:, -1:], y.shape[1], axis=1).astype(y.dtype), y)
                x, cache = y, x[:, -1:]
        return x, cache


class MidBlock(nnx.Module):
    """WanMidBlock with num_layers=1: resnet, attention, resnet."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(channels, channels, **kw) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(channels, **kw)])

    def __call__(self, x: jax.Array, cache=None, first=None):
        c0, c1 = cache if cache is not None else (None, None)
        x, c0 = self.resnets[0](x, c0, first)
        x, _ = self.attentions[0](x)
        x, c1 = self.resnets[1](x, c1, first)
        return x, (c0, c1)
