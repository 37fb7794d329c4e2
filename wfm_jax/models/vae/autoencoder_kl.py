"""diffusers AutoencoderKL (the SD3 VAE) in Flax NNX: encode to a diagonal Gaussian, decode latents.

Public methods take and return NCHW arrays exactly like diffusers; inside, everything runs NHWC.
Outputs (moments and pixels) are fp32 whatever the compute dtype.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.vae.blocks import (Conv2d, Downsample2D, GroupNorm, MidBlock2D, Upsample2D,
                                       activation, pairs, resnet_stack)

EPS = 1e-6  # diffusers' Encoder/Decoder pass resnet_eps=1e-6 to every norm
IMAGE_AXES = ("act_batch", None, None, None)


@dataclasses.dataclass(frozen=True)
class VAEConfig:
    """The config.json fields that shape the model; defaults are diffusers' AutoencoderKL defaults."""
    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple = ("DownEncoderBlock2D",)
    up_block_types: tuple = ("UpDecoderBlock2D",)
    block_out_channels: tuple = (64,)
    layers_per_block: int = 1
    act_fn: str = "silu"
    latent_channels: int = 4
    norm_num_groups: int = 32
    scaling_factor: float = 0.18215
    shift_factor: float | None = None
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    @classmethod
    def from_dict(cls, config: dict) -> "VAEConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in config.items() if k in names}
        cfg = cls(**kw)
        n = len(cfg.block_out_channels)
        for field, types, supported in (("down_block_types", cfg.down_block_types, "DownEncoderBlock2D"),
                                        ("up_block_types", cfg.up_block_types, "UpDecoderBlock2D")):
            bad = [t for t in types if t != supported]
            if bad:
                raise ValueError(f"unsupported AutoencoderKL {field} entry {bad[0]!r}; "
                                 f"supported: {supported!r}")
            if len(types) != n:
                raise ValueError(f"AutoencoderKL {field} has {len(types)} entries but "
                                 f"block_out_channels has {n}")
        activation(cfg.act_fn)  # fails early on an unsupported activation
        return cfg


def as_config(config) -> VAEConfig:
    return config if isinstance(config, VAEConfig) else VAEConfig.from_dict(config)


def vae_scale_factor(config) -> int:
    """Pixels per latent along each side (8 for SD3)."""
    return 2 ** (len(as_config(config).block_out_channels) - 1)


def scale_latents(z: jax.Array, config) -> jax.Array:
    """VAE latents -> the space the transformer works in: (z - shift) * scale."""
    cfg = as_config(config)
    return (z - (cfg.shift_factor or 0.0)) * cfg.scaling_factor


def unscale_latents(z: jax.Array, config) -> jax.Array:
    """Inverse of `scale_latents`: what `decode` takes (as diffusers' SD3 pipeline does)."""
    cfg = as_config(config)
    return z / cfg.scaling_factor + (cfg.shift_factor or 0.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DiagonalGaussian:
    """diffusers DiagonalGaussianDistribution: mean and clamped log-variance, NCHW, fp32."""
    mean: jax.Array
    logvar: jax.Array

    @classmethod
    def from_moments(cls, moments: jax.Array) -> "DiagonalGaussian":
        mean, logvar = jnp.split(moments, 2, axis=1)
        return cls(mean, jnp.clip(logvar, -30.0, 20.0))

    @property
    def std(self) -> jax.Array:
        return jnp.exp(0.5 * self.logvar)

    def mode(self) -> jax.Array:
        return self.mean

    def sample(self, key: jax.Array) -> jax.Array:
        return self.mean + self.std * jax.random.normal(key, self.mean.shape, self.mean.dtype)


class Encoder(nnx.Module):
    """conv_in -> down blocks (resnets, stride-2 conv except last) -> mid block -> norm/act/conv_out."""

    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        res = dict(groups=cfg.norm_num_groups, eps=EPS, act_fn=cfg.act_fn, **kw)
        chans = cfg.block_out_channels
        self.act = activation(cfg.act_fn)
        self.conv_in = Conv2d(cfg.in_channels, chans[0], 3, padding=1, **kw)
        self.down_blocks = nnx.List([
            DownBlock(c_in, c_out, cfg.layers_per_block, downsample=i < len(chans) - 1, res=res)
            for i, (c_in, c_out) in enumerate(pairs(chans))])
        self.mid_block = MidBlock2D(chans[-1], add_attention=cfg.mid_block_add_attention, **res)
        self.conv_norm_out = GroupNorm(cfg.norm_num_groups, chans[-1], eps=EPS,
                                       param_dtype=param_dtype)
        self.conv_out = Conv2d(chans[-1], 2 * cfg.latent_channels, 3, padding=1, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(self.act(self.conv_norm_out(x)))


class Decoder(nnx.Module):
    """conv_in -> mid block -> up blocks (layers_per_block + 1 resnets, x2 upsample except last)."""

    def __init__(self, cfg: VAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        res = dict(groups=cfg.norm_num_groups, eps=EPS, act_fn=cfg.act_fn, **kw)
        chans = tuple(reversed(cfg.block_out_channels))
        self.act = activation(cfg.act_fn)
        self.conv_in = Conv2d(cfg.latent_channels, chans[0], 3, padding=1, **kw)
        self.mid_block = MidBlock2D(chans[0], add_attention=cfg.mid_block_add_attention, **res)
        self.up_blocks = nnx.List([
            UpBlock(c_in, c_out, cfg.layers_per_block + 1, upsample=i < len(chans) - 1, res=res)
            for i, (c_in, c_out) in enumerate(pairs(chans))])
        self.conv_norm_out = GroupNorm(cfg.norm_num_groups, chans[-1], eps=EPS,
                                       param_dtype=param_dtype)
        self.conv_out = Conv2d(chans[-1], cfg.out_channels, 3, padding=1, **kw)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(self.act(self.conv_norm_out(x)))


class DownBlock(nnx.Module):
    """DownEncoderBlock2D."""

    def __init__(self, c_in: int, c_out: int, layers: int, *, downsample: bool, res: dict):
        self.resnets = resnet_stack(c_in, c_out, layers, **res)
        self.downsample = (Downsample2D(c_out, rngs=res["rngs"], dtype=res["dtype"],
                                        param_dtype=res["param_dtype"]) if downsample else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x)
        return self.downsample(x) if self.downsample is not None else x


class UpBlock(nnx.Module):
    """UpDecoderBlock2D."""

    def __init__(self, c_in: int, c_out: int, layers: int, *, upsample: bool, res: dict):
        self.resnets = resnet_stack(c_in, c_out, layers, **res)
        self.upsample = (Upsample2D(c_out, rngs=res["rngs"], dtype=res["dtype"],
                                    param_dtype=res["param_dtype"]) if upsample else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x)
        return self.upsample(x) if self.upsample is not None else x


class AutoencoderKL(nnx.Module):
    """Built from the diffusers config.json dict; `dtype` is the compute dtype (None = input's)."""

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = as_config(config)
        cfg = self.config
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.dtype = dtype
        self.encoder = Encoder(cfg, **kw)
        self.decoder = Decoder(cfg, **kw)
        c = cfg.latent_channels
        self.quant_conv = Conv2d(2 * c, 2 * c, 1, **kw) if cfg.use_quant_conv else None
        self.post_quant_conv = Conv2d(c, c, 1, **kw) if cfg.use_post_quant_conv else None

    def encode_moments(self, x: jax.Array) -> jax.Array:
        """Pixels (B, C, H, W) in [-1, 1] -> concatenated (mean, logvar) (B, 2*latent, H/f, W/f)."""
        h = to_nhwc(x, self.dtype)
        h = self.encoder(h)
        if self.quant_conv is not None:
            h = self.quant_conv(h)
        return to_nchw(h)

    def encode(self, x: jax.Array) -> DiagonalGaussian:
        return DiagonalGaussian.from_moments(self.encode_moments(x))

    def decode(self, z: jax.Array) -> jax.Array:
        """Unscaled latents (B, latent, h, w) -> pixels (B, C, h*f, w*f), roughly in [-1, 1]."""
        h = to_nhwc(z, self.dtype)
        if self.post_quant_conv is not None:
            h = self.post_quant_conv(h)
        return to_nchw(self.decoder(h))


def to_nhwc(x: jax.Array, dtype) -> jax.Array:
    x = jnp.transpose(x, (0, 2, 3, 1))
    return constrain(x.astype(dtype) if dtype is not None else x, IMAGE_AXES)


def to_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x.astype(jnp.float32), (0, 3, 1, 2))
