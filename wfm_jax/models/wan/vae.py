"""diffusers AutoencoderKLWan (the Wan2.1 video VAE, shared by Wan2.1, Cosmos-Predict2.5 and
SANA-Video) in Flax NNX.

Public methods take and return diffusers' layout, (B, C, T, H, W); inside, everything runs
(B, T, H, W, C). Encode and decode run the video in chunks with the causal convs' caches carried
between them, exactly as diffusers does: this is the only correct path (one pass over all frames
without the cache skips the temporal upsampling entirely). Encode: the first frame alone, then
chunks of 4 frames, so a video has 4k+1 frames and gives k+1 latent frames. Decode: the first
latent frame alone (one frame out), then one latent frame per chunk (4 frames out each), clamped
to [-1, 1]. Every chunk runs in one `lax.scan`, the first too (`run_scanned`), so an encode or
a decode is one copy of the network to compile, not two (session 32: about half the TPU compile).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.vae.autoencoder_kl import DiagonalGaussian
from wfm_jax.models.wan.vae_layers import CausalConv3d, ChannelRMSNorm, MidBlock, Resample, ResidualBlock

ENCODE_CHUNK = 4  # frames per encoder chunk after the first (diffusers hard-codes 4)
VIDEO_AXES = ("act_batch", None, None, None, None)

# diffusers' defaults: the released Wan2.1 VAE's per-channel latent statistics.
WAN21_LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687,
                     2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """The config.json fields of AutoencoderKLWan; defaults are diffusers' (the Wan2.1 VAE)."""
    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple = ()
    temperal_downsample: tuple = (False, True, True)  # diffusers' spelling
    dropout: float = 0.0
    latents_mean: tuple = WAN21_LATENTS_MEAN
    latents_std: tuple = WAN21_LATENTS_STD
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    @classmethod
    def from_dict(cls, config: dict) -> WanVAEConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in config.items() if k in names}
        cfg = cls(**kw)
        if cfg.is_residual or cfg.patch_size is not None:
            raise ValueError("AutoencoderKLWan with is_residual or patch_size (the Wan2.2 VAE) is "
                             "not supported; only the Wan2.1 VAE is")
        if cfg.attn_scales:  # diffusers' encoder crashes on them (its attention takes no cache)
            raise ValueError(f"AutoencoderKLWan attn_scales {list(cfg.attn_scales)} is not "
                             f"supported (diffusers cannot run it either); released VAEs use []")
        if len(cfg.temperal_downsample) != len(cfg.dim_mult) - 1:
            raise ValueError(f"AutoencoderKLWan temperal_downsample has "
                             f"{len(cfg.temperal_downsample)} entries; dim_mult "
                             f"{list(cfg.dim_mult)} needs {len(cfg.dim_mult) - 1}")
        for name in ("latents_mean", "latents_std"):
            if len(getattr(cfg, name)) != cfg.z_dim:
                raise ValueError(f"AutoencoderKLWan {name} has {len(getattr(cfg, name))} values; "
                                 f"z_dim is {cfg.z_dim}")
        return cfg

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(bool(t) for t in self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)


def as_config(config) -> WanVAEConfig:
    return config if isinstance(config, WanVAEConfig) else WanVAEConfig.from_dict(config)


def latent_frames(num_frames: int) -> int:
    """Latent frames for a video of `num_frames`; raises unless num_frames is 4k+1."""
    if num_frames < 1 or (num_frames - 1) % ENCODE_CHUNK:
        raise ValueError(f"the Wan VAE encodes 4k+1 frames (1, 5, 9, ..., 81); got {num_frames}")
    return 1 + (num_frames - 1) // ENCODE_CHUNK


def _stats(config, z: jax.Array):
    cfg = as_config(config)
    shape = (1, cfg.z_dim) + (1,) * (z.ndim - 2)
    mean = jnp.asarray(cfg.latents_mean, jnp.float32).reshape(shape)
    inv_std = 1.0 / jnp.asarray(cfg.latents_std, jnp.float32).reshape(shape)
    return mean, inv_std


def scale_latents(z: jax.Array, config) -> jax.Array:
    """VAE latents (B, C, T, h, w) -> the space the transformer works in: (z - mean) / std, per
    channel, in fp32 (written as diffusers' pipelines write it: times the reciprocal std)."""
    mean, inv_std = _stats(config, z)
    return (z.astype(jnp.float32) - mean) * inv_std


def unscale_latents(z: jax.Array, config) -> jax.Array:
    """Inverse of `scale_latents`: what `decode` takes (as diffusers' WanPipeline computes it)."""
    mean, inv_std = _stats(config, z)
    return z.astype(jnp.float32) / inv_std + mean


class Encoder3d(nnx.Module):
    """WanEncoder3d: conv_in, a flat list of residual and downsample blocks, mid block,
    norm, SiLU, conv_out (to 2 * z_dim: mean and log-variance)."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.in_channels, dims[0], 3, padding=1, **kw)
        blocks: list[ResidualBlock | Resample] = []
        for i, (c_in, c_out) in enumerate(itertools.pairwise(dims)):
            for j in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(c_in if j == 0 else c_out, c_out, **kw))
            if i != len(cfg.dim_mult) - 1:
                mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
                blocks.append(Resample(c_out, mode, **kw))
        self.down_blocks = nnx.List(blocks)
        self.mid_block = MidBlock(dims[-1], **kw)
        self.norm_out = ChannelRMSNorm(dims[-1], param_dtype=param_dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=1, **kw)

    def __call__(self, x: jax.Array, cache=None, first=None):
        """One chunk (B, t, H, W, C) -> (moments before quant_conv, cache for the next chunk);
        `first` as in vae_layers (run_scanned)."""
        cache = cache or {"conv_in": None, "down": [None] * len(self.down_blocks), "mid": None,
                          "conv_out": None}
        x, conv_in = self.conv_in(x, cache["conv_in"], first)
        down = []
        for block, c in zip(self.down_blocks, cache["down"]):
            x, c = block(x, c, first)
            down.append(c)
        x, mid = self.mid_block(x, cache["mid"], first)
        x, conv_out = self.conv_out(jax.nn.silu(self.norm_out(x)), cache["conv_out"], first)
        return x, {"conv_in": conv_in, "down": down, "mid": mid, "conv_out": conv_out}


class UpBlock(nnx.Module):
    """WanUpBlock: num_res_blocks + 1 residual blocks, then an optional upsampler."""

    def __init__(self, c_in: int, c_out: int, num_res_blocks: int, upsample: str | None, *,
                 rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(c_in if i == 0 else c_out, c_out, **kw)
                                 for i in range(num_res_blocks + 1)])
        self.upsampler = Resample(c_out, upsample, **kw) if upsample else None

    def __call__(self, x: jax.Array, cache=None, first=None):
        cache = cache or {"resnets": [None] * len(self.resnets), "upsampler": None}
        resnets = []
        for resnet, c in zip(self.resnets, cache["resnets"]):
            x, c = resnet(x, c, first)
            resnets.append(c)
        upsampler = None
        if self.upsampler is not None:
            x, upsampler = self.upsampler(x, cache["upsampler"], first)
        return x, {"resnets": resnets, "upsampler": upsampler}


class Decoder3d(nnx.Module):
    """WanDecoder3d: conv_in, mid block, up blocks (each upsampler halves the channels, so the next
    block reads half of the previous block's width), norm, SiLU, conv_out."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        base = cfg.decoder_base_dim or cfg.base_dim
        mult = cfg.dim_mult
        dims = [base * m for m in (mult[-1], *mult[::-1])]
        temporal = tuple(reversed(cfg.temperal_downsample))
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1, **kw)
        self.mid_block = MidBlock(dims[0], **kw)
        blocks = []
        for i, (c_in, c_out) in enumerate(itertools.pairwise(dims)):
            if i > 0:
                c_in //= 2
            mode = None
            if i != len(mult) - 1:
                mode = "upsample3d" if temporal[i] else "upsample2d"
            blocks.append(UpBlock(c_in, c_out, cfg.num_res_blocks, mode, **kw))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = ChannelRMSNorm(dims[-1], param_dtype=param_dtype)
        self.conv_out = CausalConv3d(dims[-1], cfg.out_channels, 3, padding=1, **kw)

    def __call__(self, x: jax.Array, cache=None, first=None):
        """One latent chunk -> (frames, cache); `first` as in vae_layers (run_scanned)."""
        cache = cache or {"conv_in": None, "mid": None, "up": [None] * len(self.up_blocks),
                          "conv_out": None}
        x, conv_in = self.conv_in(x, cache["conv_in"], first)
        x, mid = self.mid_block(x, cache["mid"], first)
        up = []
        for block, c in zip(self.up_blocks, cache["up"]):
            x, c = block(x, c, first)
            up.append(c)
        x, conv_out = self.conv_out(jax.nn.silu(self.norm_out(x)), cache["conv_out"], first)
        return x, {"conv_in": conv_in, "mid": mid, "up": up, "conv_out": conv_out}


def run_scanned(module, x: jax.Array, chunk: int) -> jax.Array:
    """The outputs of diffusers' chunk loop (the first frame alone with no cache, then `chunk`
    frames at a time carrying it) from one compiled copy of the module instead of two:
    module(chunk, cache, first) -> (y, cache) over the first frame, padded in front to a chunk,
    then `chunk` frames at a time, as one lax.scan. The first chunk runs with
    zero caches and `first` set and keeps its output's last frame only. The padding's work is
    wasted: on an 81-frame Wan clip, 3 of the 84 frames a decode computes or an encode reads."""
    b, t = x.shape[:2]
    if t == 1:  # one chunk: one copy of the module either way, and no padding to compute
        return module(x, None)[0]
    cache = jax.eval_shape(lambda: module(x[:, :1], None)[1])
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)
    pad = jnp.zeros((b, chunk - 1, *x.shape[2:]), x.dtype)
    n = 1 + (t - 1) // chunk
    chunks = jnp.concatenate([pad, x], axis=1)
    chunks = chunks.reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)

    def step(cache, inputs):
        piece, first = inputs
        out, cache = module(piece, cache, first)
        return cache, out

    _, ys = jax.lax.scan(step, cache, (chunks, jnp.arange(n) == 0))  # (n, B, r, ...)
    head, rest = ys[0][:, -1:], ys[1:].swapaxes(0, 1)
    return jnp.concatenate([head, rest.reshape(b, -1, *ys.shape[3:])], axis=1)


class AutoencoderKLWan(nnx.Module):
    """Built from the diffusers config.json dict; `dtype` is the compute dtype (None = the input's;
    the Wan pipelines run this VAE in fp32)."""

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.config = as_config(config)
        cfg = self.config
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.dtype = dtype
        self.encoder = Encoder3d(cfg, **kw)
        self.quant_conv = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1, **kw)
        self.post_quant_conv = CausalConv3d(cfg.z_dim, cfg.z_dim, 1, **kw)
        self.decoder = Decoder3d(cfg, **kw)

    def encode_moments(self, x: jax.Array) -> jax.Array:
        """Video (B, C, T, H, W) in [-1, 1], T = 4k+1 -> (mean, logvar) concatenated on channels:
        (B, 2 * z_dim, k+1, H/f, W/f) with f = config.spatial_factor (8 when released), fp32."""
        latent_frames(x.shape[2])
        h = to_channels_last(x, self.dtype)
        h = run_scanned(self.encoder, h, ENCODE_CHUNK)
        return to_channels_first(self.quant_conv(h)[0])

    def encode(self, x: jax.Array) -> DiagonalGaussian:
        return DiagonalGaussian.from_moments(self.encode_moments(x))

    def decode(self, z: jax.Array) -> jax.Array:
        """Unscaled latents (B, z_dim, T, h, w) -> video (B, C, 1 + r*(T-1), f*h, f*w) clamped to
        [-1, 1], r and f the config's temporal and spatial factors (released: 4T-3 frames, 8x)."""
        h = self.post_quant_conv(to_channels_last(z, self.dtype))[0]
        h = run_scanned(self.decoder, h, 1)
        return jnp.clip(to_channels_first(h), -1.0, 1.0)


def to_channels_last(x: jax.Array, dtype) -> jax.Array:
    x = jnp.moveaxis(x, 1, -1)
    return constrain(x.astype(dtype) if dtype is not None else x, VIDEO_AXES)


def to_channels_first(x: jax.Array) -> jax.Array:
    return jnp.moveaxis(x.astype(jnp.float32), -1, 1)
