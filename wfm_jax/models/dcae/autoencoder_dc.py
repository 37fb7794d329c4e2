"""diffusers AutoencoderDC (DC-AE, SANA1.5's image VAE) in Flax NNX: deterministic encode to a
latent, decode back (spec video_models.md §2.6).

Public methods take and return NCHW arrays exactly like diffusers; inside, everything runs NHWC.
Outputs are fp32 whatever the compute dtype. Module and attribute names follow diffusers (stages
are lists whose entries are numbered as diffusers' nn.Sequential numbers them), so the weight
table is a walk over the same config.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.dcae.blocks import (Conv2d, DCDownBlock2d, DCUpBlock2d, EfficientViTBlock,
                                        ResBlock, RMSNorm, activation, group_mean,
                                        repeat_channels)

IMAGE_AXES = ("act_batch", None, None, None)
BLOCK_TYPES = ("ResBlock", "EfficientViTBlock")
DOWNSAMPLE_TYPES = ("pixel_unshuffle", "Conv")
UPSAMPLE_TYPES = ("pixel_shuffle", "interpolate")


@dataclasses.dataclass(frozen=True)
class DCAEConfig:
    """AutoencoderDC's config.json fields; per-block fields are expanded to one entry per block
    (diffusers accepts a single string for all). Defaults are diffusers'."""
    in_channels: int = 3
    latent_channels: int = 32
    attention_head_dim: int = 32
    encoder_block_types: tuple = ("ResBlock",)
    decoder_block_types: tuple = ("ResBlock",)
    encoder_block_out_channels: tuple = (128, 256, 512, 512, 1024, 1024)
    decoder_block_out_channels: tuple = (128, 256, 512, 512, 1024, 1024)
    encoder_layers_per_block: tuple = (2, 2, 2, 3, 3, 3)
    decoder_layers_per_block: tuple = (3, 3, 3, 3, 3, 3)
    encoder_qkv_multiscales: tuple = ((), (), (), (5,), (5,), (5,))
    decoder_qkv_multiscales: tuple = ((), (), (), (5,), (5,), (5,))
    upsample_block_type: str = "pixel_shuffle"
    downsample_block_type: str = "pixel_unshuffle"
    decoder_norm_types: tuple = ("rms_norm",)
    decoder_act_fns: tuple = ("silu",)
    encoder_out_shortcut: bool = True
    decoder_in_shortcut: bool = True
    decoder_conv_act_fn: str = "relu"
    scaling_factor: float = 1.0

    @classmethod
    def from_dict(cls, config: dict) -> "DCAEConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: _tuples(v) for k, v in config.items() if k in names}
        n_enc = len(kw.get("encoder_block_out_channels", cls.encoder_block_out_channels))
        n_dec = len(kw.get("decoder_block_out_channels", cls.decoder_block_out_channels))
        for name, n in (("encoder_block_types", n_enc), ("decoder_block_types", n_dec),
                        ("decoder_norm_types", n_dec), ("decoder_act_fns", n_dec)):
            value = kw.get(name, getattr(cls, name))
            kw[name] = (value,) * n if isinstance(value, str) else value
        cfg = cls(**kw)
        cfg._check(n_enc, n_dec)
        return cfg

    def _check(self, n_enc: int, n_dec: int) -> None:
        for name, n in (("encoder_block_types", n_enc), ("encoder_layers_per_block", n_enc),
                        ("encoder_qkv_multiscales", n_enc), ("decoder_block_types", n_dec),
                        ("decoder_layers_per_block", n_dec), ("decoder_qkv_multiscales", n_dec),
                        ("decoder_norm_types", n_dec), ("decoder_act_fns", n_dec)):
            if len(getattr(self, name)) != n:
                raise ValueError(f"AutoencoderDC {name} has {len(getattr(self, name))} entries; "
                                 f"its block_out_channels has {n}")
        for t in self.encoder_block_types + self.decoder_block_types:
            if t not in BLOCK_TYPES:
                raise ValueError(f"unsupported AutoencoderDC block type {t!r}; "
                                 f"supported: {BLOCK_TYPES}")
        bad = [t for t in self.decoder_norm_types if t != "rms_norm"]
        if bad:  # batch_norm would need running statistics; no released SANA VAE uses it
            raise ValueError(f"unsupported AutoencoderDC decoder norm type {bad[0]!r}; "
                             f"only 'rms_norm' is ported")
        if self.downsample_block_type not in DOWNSAMPLE_TYPES:
            raise ValueError(f"unsupported AutoencoderDC downsample_block_type "
                             f"{self.downsample_block_type!r}; supported: {DOWNSAMPLE_TYPES}")
        if self.upsample_block_type not in UPSAMPLE_TYPES:
            raise ValueError(f"unsupported AutoencoderDC upsample_block_type "
                             f"{self.upsample_block_type!r}; supported: {UPSAMPLE_TYPES}")
        for fn in self.decoder_act_fns + (self.decoder_conv_act_fn,):
            activation(fn)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent along each side (32 for SANA's f32c32)."""
        return 2 ** (len(self.encoder_block_out_channels) - 1)


def _tuples(value):
    """JSON lists (nested too) -> tuples, so configs compare and hash."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def as_config(config) -> DCAEConfig:
    return config if isinstance(config, DCAEConfig) else DCAEConfig.from_dict(config)


def scale_latents(z: jax.Array, config) -> jax.Array:
    """Encoder latents -> the DiT's space: z * scaling_factor (no shift)."""
    return z * as_config(config).scaling_factor


def unscale_latents(z: jax.Array, config) -> jax.Array:
    """Inverse of `scale_latents`: what `decode` takes (SanaPipeline divides by the factor)."""
    return z / as_config(config).scaling_factor


def _block(block_type: str, channels: int, *, head_dim: int, act_fn: str, multiscales: tuple,
           kw: dict):
    if block_type == "ResBlock":
        return ResBlock(channels, channels, act_fn=act_fn, **kw)
    return EfficientViTBlock(channels, head_dim=head_dim, kernel_sizes=multiscales, **kw)


class Encoder(nnx.Module):
    def __init__(self, cfg: DCAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        chans, layers = cfg.encoder_block_out_channels, cfg.encoder_layers_per_block
        unshuffle = cfg.downsample_block_type == "pixel_unshuffle"
        self.conv_in: Conv2d | DCDownBlock2d
        if layers[0] > 0:
            self.conv_in = Conv2d(cfg.in_channels, chans[0], 3, padding=1, **kw)
        else:  # the first stage is skipped: its downsampling moves into conv_in
            self.conv_in = DCDownBlock2d(cfg.in_channels, chans[1], unshuffle=unshuffle,
                                         shortcut=False, **kw)
        stages = []
        for i, (c, n) in enumerate(zip(chans, layers)):
            stage = [_block(cfg.encoder_block_types[i], c, head_dim=cfg.attention_head_dim,
                            act_fn="silu", multiscales=cfg.encoder_qkv_multiscales[i], kw=kw)
                     for _ in range(n)]
            if i < len(chans) - 1 and n > 0:
                stage.append(DCDownBlock2d(c, chans[i + 1], unshuffle=unshuffle, shortcut=True,
                                           **kw))
            stages.append(nnx.List(stage))
        self.down_blocks = nnx.List(stages)
        self.conv_out = Conv2d(chans[-1], cfg.latent_channels, 3, padding=1, **kw)
        self.out_shortcut = cfg.encoder_out_shortcut
        self.latent_channels = cfg.latent_channels

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for stage in self.down_blocks:
            for block in stage:
                x = block(x)
        out = self.conv_out(x)
        return out + group_mean(x, self.latent_channels) if self.out_shortcut else out


class Decoder(nnx.Module):
    def __init__(self, cfg: DCAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        chans, layers = cfg.decoder_block_out_channels, cfg.decoder_layers_per_block
        interpolate = cfg.upsample_block_type == "interpolate"
        self.conv_in = Conv2d(cfg.latent_channels, chans[-1], 3, padding=1, **kw)
        self.in_repeats = chans[-1] // cfg.latent_channels if cfg.decoder_in_shortcut else 0
        stages = []
        for i, (c, n) in enumerate(zip(chans, layers)):
            stage = []
            if i < len(chans) - 1 and n > 0:
                stage.append(DCUpBlock2d(chans[i + 1], c, interpolate=interpolate, shortcut=True,
                                         **kw))
            stage += [_block(cfg.decoder_block_types[i], c, head_dim=cfg.attention_head_dim,
                             act_fn=cfg.decoder_act_fns[i],
                             multiscales=cfg.decoder_qkv_multiscales[i], kw=kw)
                      for _ in range(n)]
            stages.append(nnx.List(stage))
        self.up_blocks = nnx.List(stages)  # run last stage first, as diffusers does
        channels = chans[0] if layers[0] > 0 else chans[1]
        self.norm_out = RMSNorm(channels, param_dtype=param_dtype)
        self.conv_act = activation(cfg.decoder_conv_act_fn)
        self.conv_out: Conv2d | DCUpBlock2d
        if layers[0] > 0:
            self.conv_out = Conv2d(channels, cfg.in_channels, 3, padding=1, **kw)
        else:
            self.conv_out = DCUpBlock2d(channels, cfg.in_channels, interpolate=interpolate,
                                        shortcut=False, **kw)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = self.conv_in(z)
        if self.in_repeats:
            x = x + repeat_channels(z, self.in_repeats)
        for stage in reversed(self.up_blocks):
            for block in stage:
                x = block(x)
        return self.conv_out(self.conv_act(self.norm_out(x)))


class AutoencoderDC(nnx.Module):
    """Built from the diffusers config.json dict; `dtype` is the compute dtype (None = input's)."""

    def __init__(self, config, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = as_config(config)
        self.dtype = dtype
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.encoder = Encoder(self.config, **kw)
        self.decoder = Decoder(self.config, **kw)

    def encode(self, x: jax.Array) -> jax.Array:
        """Pixels (B, C, H, W) in [-1, 1], H and W multiples of the spatial factor -> the
        unscaled latent (B, latent, H/f, W/f) (diffusers' `encode(x).latent`)."""
        f = self.config.spatial_factor
        if x.ndim != 4 or x.shape[2] % f or x.shape[3] % f:
            raise ValueError(f"AutoencoderDC.encode takes (B, C, H, W) with H and W multiples "
                             f"of {f}, got shape {tuple(x.shape)}")
        return to_nchw(self.encoder(to_nhwc(x, self.dtype)))

    def decode(self, z: jax.Array) -> jax.Array:
        """Unscaled latents (B, latent, h, w) -> pixels (B, C, h*f, w*f), roughly in [-1, 1]."""
        if z.ndim != 4 or z.shape[1] != self.config.latent_channels:
            raise ValueError(f"AutoencoderDC.decode takes (B, {self.config.latent_channels}, h, "
                             f"w), got shape {tuple(z.shape)}")
        return to_nchw(self.decoder(to_nhwc(z, self.dtype)))


def to_nhwc(x: jax.Array, dtype) -> jax.Array:
    x = jnp.transpose(x, (0, 2, 3, 1))
    return constrain(x.astype(dtype) if dtype is not None else x, IMAGE_AXES)


def to_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x.astype(jnp.float32), (0, 3, 1, 2))


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs) -> AutoencoderDC:
    return AutoencoderDC(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
