"""Building blocks of diffusers' AutoencoderKL, in NHWC (flax's conv layout).

Each block mirrors one diffusers module (models/resnet.py ResnetBlock2D, downsampling.py
Downsample2D, upsampling.py Upsample2D, unet_2d_blocks.py UNetMidBlock2D and the group-normed
self-attention it holds) so the weight table maps one-to-one. Group norms and the attention softmax
compute in fp32 whatever the compute dtype.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import Linear, param

CHANNELS = ("conv_out",)  # logical axis of every per-channel vector (biases, norm scales)


class Conv2d(nnx.Module):
    """torch.nn.Conv2d on NHWC inputs: kernel is HWIO (torch OIHW moved), bias per output channel.

    `padding` is an int (same on every side, as torch) or ((top, bottom), (left, right)).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, rngs: nnx.Rngs,
                 stride: int = 1, padding=0, bias: bool = True, dtype=None,
                 param_dtype=jnp.float32):
        self.stride = stride
        self.padding = ((padding, padding), (padding, padding)) if isinstance(padding, int) \
            else tuple(tuple(p) for p in padding)
        self.dtype = dtype
        init = nnx.initializers.lecun_normal()
        shape = (kernel_size, kernel_size, in_channels, out_channels)
        self.kernel = param(init(rngs.params(), shape, param_dtype),
                            (None, None, "conv_in", "conv_out"))
        self.bias = param(jnp.zeros((out_channels,), param_dtype), CHANNELS) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype or x.dtype
        y = jax.lax.conv_general_dilated(
            x.astype(dtype), self.kernel[...].astype(dtype),
            window_strides=(self.stride, self.stride), padding=self.padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        return y


class GroupNorm(nnx.Module):
    """torch.nn.GroupNorm (affine) over the channel axis of NHWC inputs, computed in fp32."""

    def __init__(self, num_groups: int, channels: int, *, eps: float = 1e-6,
                 param_dtype=jnp.float32):
        if channels % num_groups:
            raise ValueError(f"GroupNorm: {channels} channels do not split into {num_groups} groups")
        self.num_groups, self.eps = num_groups, eps
        self.scale = param(jnp.ones((channels,), param_dtype), CHANNELS)
        self.bias = param(jnp.zeros((channels,), param_dtype), CHANNELS)

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        *lead, c = x.shape
        g = x.astype(jnp.float32).reshape(*lead, self.num_groups, c // self.num_groups)
        axes = tuple(range(1, g.ndim - 2)) + (g.ndim - 1,)  # spatial dims and channels in group
        mean = jnp.mean(g, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(g - mean), axis=axes, keepdims=True)
        y = ((g - mean) * jax.lax.rsqrt(var + self.eps)).reshape(x.shape)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(dtype)


def activation(name: str):
    if name in ("silu", "swish"):
        return jax.nn.silu
    raise ValueError(f"unsupported VAE act_fn {name!r}; supported: 'silu', 'swish'")


class ResnetBlock2D(nnx.Module):
    """norm1 -> act -> conv1 -> norm2 -> act -> conv2, plus a (1x1-projected) skip; no time embedding."""

    def __init__(self, in_channels: int, out_channels: int, *, groups: int, eps: float, act_fn: str,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.act = activation(act_fn)
        self.norm1 = GroupNorm(groups, in_channels, eps=eps, param_dtype=param_dtype)
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1, **kw)
        self.norm2 = GroupNorm(groups, out_channels, eps=eps, param_dtype=param_dtype)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1, **kw)
        self.conv_shortcut = (Conv2d(in_channels, out_channels, 1, **kw)
                              if in_channels != out_channels else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv1(self.act(self.norm1(x)))
        h = self.conv2(self.act(self.norm2(h)))
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return skip + h.astype(skip.dtype)  # output_scale_factor is 1 in every AutoencoderKL block


class Downsample2D(nnx.Module):
    """Stride-2 3x3 conv; diffusers pads (right, bottom) by one and the conv itself by zero."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=((0, 1), (0, 1)), rngs=rngs,
                           dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


class Upsample2D(nnx.Module):
    """Nearest-neighbour x2 (torch F.interpolate mode="nearest") then a 3x3 conv."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.conv = Conv2d(channels, channels, 3, padding=1, rngs=rngs, dtype=dtype,
                           param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
        return self.conv(x)


# Queries per attention chunk. The mid block attends over every latent position; unchunked, its
# (H*W)^2 scores are what a large decode spends its memory on (the tiny VAE does not downsample:
# 2 images at 192x192 px held 3 x 2 x 36864^2 fp32 = 32.6 GB). Chunked: (chunk x H*W) at a time.
QUERY_CHUNK = 1024


def query_chunked_attention(q, k, v, chunk: int = QUERY_CHUNK):
    """jax.nn.dot_product_attention over (B, T, N, H), `chunk` queries at a time (each query's
    softmax is over all keys either way, so the result is the same)."""
    b, t, n, d = q.shape
    if t <= chunk:
        return jax.nn.dot_product_attention(q, k, v)
    pad = (-t) % chunk
    chunks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, -1, chunk, n, d)
    out = jax.lax.map(lambda qc: jax.nn.dot_product_attention(qc, k, v), chunks.swapaxes(0, 1))
    return out.swapaxes(0, 1).reshape(b, t + pad, n, d)[:, :t]


class SpatialSelfAttention(nnx.Module):
    """diffusers Attention as the VAE mid block builds it: group norm over channels, attention over
    all H*W positions, out projection, residual add, divide by rescale_output_factor (1)."""

    def __init__(self, channels: int, *, heads: int, groups: int, eps: float, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        self.heads = heads
        self.dtype = dtype
        kw = dict(rngs=rngs, axes=("conv_in", "conv_out"), dtype=dtype, param_dtype=param_dtype)
        self.group_norm = GroupNorm(groups, channels, eps=eps, param_dtype=param_dtype)
        self.to_q = Linear(channels, channels, **kw)
        self.to_k = Linear(channels, channels, **kw)
        self.to_v = Linear(channels, channels, **kw)
        self.to_out = Linear(channels, channels, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        tokens = self.group_norm(x).reshape(b, h * w, c)
        split = lambda t: t.reshape(b, h * w, self.heads, c // self.heads)
        q, k, v = (split(f(tokens)) for f in (self.to_q, self.to_k, self.to_v))
        out = query_chunked_attention(q, k, v)  # softmax in fp32
        out = self.to_out(out.reshape(b, h * w, c)).reshape(b, h, w, c)
        return x + out.astype(x.dtype)


class MidBlock2D(nnx.Module):
    """resnet, then (attention, resnet) once: UNetMidBlock2D with num_layers=1."""

    def __init__(self, channels: int, *, groups: int, eps: float, act_fn: str, add_attention: bool,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([
            ResnetBlock2D(channels, channels, groups=groups, eps=eps, act_fn=act_fn, **kw)
            for _ in range(2)])
        # diffusers gives the VAE mid block one head whose width is all channels
        self.attention = (SpatialSelfAttention(channels, heads=1, groups=groups, eps=eps, **kw)
                          if add_attention else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.resnets[0](x)
        if self.attention is not None:
            x = self.attention(x)
        return self.resnets[1](x)


def resnet_stack(channels_in: int, channels_out: int, count: int, **kw) -> nnx.List:
    """`count` resnets: the first maps channels_in -> channels_out, the rest keep channels_out."""
    return nnx.List([ResnetBlock2D(channels_in if i == 0 else channels_out, channels_out, **kw)
                     for i in range(count)])


def pairs(values: Sequence[int]) -> list[tuple[int, int]]:
    """(input, output) channels of each block when block i reads block i-1's output."""
    return [(values[max(i - 1, 0)], v) for i, v in enumerate(values)]
