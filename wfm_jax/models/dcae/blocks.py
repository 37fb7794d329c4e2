"""Building blocks of diffusers' AutoencoderDC (DC-AE, SANA's image VAE), in NHWC.

Each class mirrors one diffusers module, with the same attribute names, so the weight table maps
one-to-one: ResBlock, EfficientViTBlock = SanaMultiscaleLinearAttention ("LiteMLA") + GLUMBConv,
DCDownBlock2d and DCUpBlock2d with their space-to-channel / channel-to-space shortcuts. Norms
compute in fp32; LiteMLA's linear attention runs in fp32 as diffusers does.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import Linear, param

CHANNELS = ("conv_out",)  # logical axis of every per-channel vector (biases, norm scales)
NORM_EPS = 1e-5  # diffusers' get_normalization and GLUMBConv use RMSNorm(eps=1e-5)
ATTN_EPS = 1e-15  # SanaMultiscaleLinearAttention's eps

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # torch nn.GELU() is the erf form
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported AutoencoderDC activation {name!r}; "
                         f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


class Conv2d(nnx.Module):
    """torch.nn.Conv2d (symmetric int padding, optional groups) on NHWC inputs; kernel HWIO with
    I = in_channels / groups, as torch's OIHW moved."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, rngs: nnx.Rngs,
                 stride: int = 1, padding: int = 0, groups: int = 1, bias: bool = True,
                 dtype=None, param_dtype=jnp.float32):
        self.stride, self.padding, self.groups, self.dtype = stride, padding, groups, dtype
        shape = (kernel_size, kernel_size, in_channels // groups, out_channels)
        self.kernel = param(nnx.initializers.lecun_normal()(rngs.params(), shape, param_dtype),
                            (None, None, "conv_in", "conv_out"))
        self.bias = param(jnp.zeros((out_channels,), param_dtype), CHANNELS) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype or x.dtype
        p = self.padding
        y = jax.lax.conv_general_dilated(
            x.astype(dtype), self.kernel[...].astype(dtype), (self.stride, self.stride),
            ((p, p), (p, p)), dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=self.groups)
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        return y


class RMSNorm(nnx.Module):
    """diffusers RMSNorm(C, eps=1e-5, elementwise_affine=True, bias=True) over the channel axis."""

    def __init__(self, channels: int, *, param_dtype=jnp.float32):
        self.scale = param(jnp.ones((channels,), param_dtype), CHANNELS)
        self.bias = param(jnp.zeros((channels,), param_dtype), CHANNELS)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + NORM_EPS)
        h = h * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return h.astype(x.dtype)


def pixel_unshuffle(x: jax.Array) -> jax.Array:
    """torch F.pixel_unshuffle(x, 2) in NHWC: channel c*4 + 2i + j holds pixel (2h+i, 2w+j)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4)
    return x.reshape(b, h // 2, w // 2, c * 4)


def pixel_shuffle(x: jax.Array) -> jax.Array:
    """torch F.pixel_shuffle(x, 2) in NHWC, the inverse of `pixel_unshuffle`."""
    b, h, w, c = x.shape
    x = x.reshape(b, h, w, c // 4, 2, 2).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(b, h * 2, w * 2, c // 4)


def group_mean(x: jax.Array, groups_out: int) -> jax.Array:
    """torch x.unflatten(1, (-1, g)).mean(2): average runs of consecutive channels."""
    *lead, c = x.shape
    return jnp.mean(x.reshape(*lead, groups_out, c // groups_out), axis=-1)


def repeat_channels(x: jax.Array, repeats: int) -> jax.Array:
    """torch x.repeat_interleave(repeats, dim=1): each channel `repeats` times in a row."""
    return jnp.repeat(x, repeats, axis=-1)


class ResBlock(nnx.Module):
    """conv3x3 -> act -> conv3x3 (no bias) -> RMSNorm over channels, plus the input."""

    def __init__(self, in_channels: int, out_channels: int, *, act_fn: str, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.act = activation(act_fn)
        self.conv1 = Conv2d(in_channels, in_channels, 3, padding=1, **kw)
        self.conv2 = Conv2d(in_channels, out_channels, 3, padding=1, bias=False, **kw)
        self.norm = RMSNorm(out_channels, param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.norm(self.conv2(self.act(self.conv1(x))))
        return h + x


class MultiscaleProjection(nnx.Module):
    """SanaMultiscaleAttentionProjection: depthwise k x k conv, then a 1x1 conv grouped per head
    of each of q, k, v (3 * heads groups); neither has a bias."""

    def __init__(self, channels: int, heads: int, kernel_size: int, *, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        c = 3 * channels
        self.proj_in = Conv2d(c, c, kernel_size, padding=kernel_size // 2, groups=c, **kw)
        self.proj_out = Conv2d(c, c, 1, groups=3 * heads, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj_out(self.proj_in(x))


class LiteMLA(nnx.Module):
    """SanaMultiscaleLinearAttention (residual, RMSNorm out) with diffusers' processor.

    q, k, v come from 1x1 projections; each multi-scale branch adds an aggregated copy of them.
    The concatenated channels are cut into groups of 3 * head_dim (q, k, v of one group in turn),
    q and k go through ReLU, and each group attends over all H*W positions: linear attention
    (fp32) when H*W > head_dim, else the quadratic form (diffusers' switch, static here).
    """

    def __init__(self, channels: int, *, head_dim: int, kernel_sizes: tuple, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        self.head_dim = head_dim
        heads = channels // head_dim  # mult = 1.0 in every EfficientViTBlock
        inner = heads * head_dim
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        lin = dict(bias=False, axes=("conv_in", "conv_out"), **kw)
        self.to_q = Linear(channels, inner, **lin)
        self.to_k = Linear(channels, inner, **lin)
        self.to_v = Linear(channels, inner, **lin)
        self.to_qkv_multiscale = nnx.List([MultiscaleProjection(inner, heads, k, **kw)
                                           for k in kernel_sizes])
        self.to_out = Linear(inner * (1 + len(kernel_sizes)), channels, **lin)
        self.norm_out = RMSNorm(channels, param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, _ = x.shape
        d = self.head_dim
        qkv = jnp.concatenate([self.to_q(x), self.to_k(x), self.to_v(x)], axis=-1)
        qkv = jnp.concatenate([qkv] + [m(qkv) for m in self.to_qkv_multiscale], axis=-1)
        linear = h * w > d
        if linear:
            qkv = qkv.astype(jnp.float32)
        qkv = qkv.reshape(b, h * w, -1, 3 * d)  # (B, N, groups, 3d)
        q, k, v = jax.nn.relu(qkv[..., :d]), jax.nn.relu(qkv[..., d:2 * d]), qkv[..., 2 * d:]
        if linear:
            out = self._linear(q, k, v).astype(x.dtype)
        else:
            out = self._quadratic(q, k, v)
        out = self.to_out(out.reshape(b, h, w, -1))
        return self.norm_out(out) + x

    @staticmethod
    def _linear(q, k, v):
        """(V;1) K^T Q, then the first d rows divided by the last (the normaliser)."""
        v = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
        kv = jnp.einsum("bngd,bnge->bgde", v, k)  # (B, groups, d + 1, d)
        out = jnp.einsum("bgde,bnge->bngd", kv, q)  # (B, N, groups, d + 1)
        return out[..., :-1] / (out[..., -1:] + ATTN_EPS)

    @staticmethod
    def _quadratic(q, k, v):
        """K^T Q normalised over keys (fp32), applied to V."""
        scores = jnp.einsum("bnge,bmge->bgnm", k, q).astype(jnp.float32)  # key n, query m
        scores = scores / (jnp.sum(scores, axis=2, keepdims=True) + ATTN_EPS)
        return jnp.einsum("bngd,bgnm->bmgd", v, scores.astype(v.dtype))


class GLUMBConv(nnx.Module):
    """1x1 to 2 x 4C, SiLU, depthwise 3x3, gate (first half * SiLU(second)), 1x1 back (no bias),
    RMSNorm, plus the input."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        hidden = 4 * channels  # expand_ratio 4
        self.conv_inverted = Conv2d(channels, 2 * hidden, 1, **kw)
        self.conv_depth = Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden, **kw)
        self.conv_point = Conv2d(hidden, channels, 1, bias=False, **kw)
        self.norm = RMSNorm(channels, param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv_depth(jax.nn.silu(self.conv_inverted(x)))
        h, gate = jnp.split(h, 2, axis=-1)
        return self.norm(self.conv_point(h * jax.nn.silu(gate))) + x


class EfficientViTBlock(nnx.Module):
    def __init__(self, channels: int, *, head_dim: int, kernel_sizes: tuple, rngs: nnx.Rngs,
                 dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn = LiteMLA(channels, head_dim=head_dim, kernel_sizes=kernel_sizes, **kw)
        self.conv_out = GLUMBConv(channels, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv_out(self.attn(x))


class DCDownBlock2d(nnx.Module):
    """x2 down: a stride-2 3x3 conv ("Conv") or a conv to out/4 channels then pixel_unshuffle
    ("pixel_unshuffle"); the shortcut pixel-unshuffles the input and averages channel runs."""

    def __init__(self, in_channels: int, out_channels: int, *, unshuffle: bool, shortcut: bool,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.unshuffle, self.shortcut, self.out_channels = unshuffle, shortcut, out_channels
        self.conv = Conv2d(in_channels, out_channels // 4 if unshuffle else out_channels, 3,
                           stride=1 if unshuffle else 2, padding=1, rngs=rngs, dtype=dtype,
                           param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.conv(x)
        if self.unshuffle:
            y = pixel_unshuffle(y)
        if self.shortcut:
            y = y + group_mean(pixel_unshuffle(x), self.out_channels)
        return y


class DCUpBlock2d(nnx.Module):
    """x2 up: nearest x2 then a 3x3 conv ("interpolate"), or a conv to 4 x out channels then
    pixel_shuffle ("pixel_shuffle"); the shortcut repeats each channel and pixel-shuffles."""

    def __init__(self, in_channels: int, out_channels: int, *, interpolate: bool, shortcut: bool,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.interpolate, self.shortcut = interpolate, shortcut
        self.repeats = out_channels * 4 // in_channels
        self.conv = Conv2d(in_channels, out_channels if interpolate else out_channels * 4, 3,
                           padding=1, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.interpolate:
            y = self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))
        else:
            y = pixel_shuffle(self.conv(x))
        if self.shortcut:
            y = y + pixel_shuffle(repeat_channels(x, self.repeats))
        return y
