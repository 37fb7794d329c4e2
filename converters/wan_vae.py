"""AutoencoderKLWan (the Wan2.1 video VAE): diffusers keys <-> wfm_jax state paths, one table for
both directions.

The table walks the same config the model is built from (`WanVAEConfig`), in the same order, so
a config change that adds or removes a block changes both at once.
"""
from __future__ import annotations

import itertools

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv
from wfm_jax.models.wan.vae import AutoencoderKLWan, WanVAEConfig


def _gamma(jax_prefix: str, hf_prefix: str, images: bool = False) -> list[Rule]:
    # WanRMS_norm stores gamma as (C, 1, 1, 1), or (C, 1, 1) in the attention block's 2D norm
    return [Rule(f"{jax_prefix}.gamma", f"{hf_prefix}.gamma",
                 "channels_2d" if images else "channels_3d")]


def _residual(prefix: str, c_in: int, c_out: int) -> list[Rule]:
    rules = []
    for norm_name, conv_name in (("norm1", "conv1"), ("norm2", "conv2")):
        rules += _gamma(f"{prefix}.{norm_name}", f"{prefix}.{norm_name}")
        rules += conv(f"{prefix}.{conv_name}", f"{prefix}.{conv_name}")
    if c_in != c_out:
        rules += conv(f"{prefix}.conv_shortcut", f"{prefix}.conv_shortcut")
    return rules


def _attention(prefix: str) -> list[Rule]:
    return (_gamma(f"{prefix}.norm", f"{prefix}.norm", images=True)
            + conv(f"{prefix}.to_qkv", f"{prefix}.to_qkv")
            + conv(f"{prefix}.proj", f"{prefix}.proj"))


def _resample(jax_prefix: str, hf_prefix: str, mode: str) -> list[Rule]:
    rules = conv(f"{jax_prefix}.conv", f"{hf_prefix}.resample.1")  # resample.0: pad / upsample
    if mode.endswith("3d"):
        rules += conv(f"{jax_prefix}.time_conv", f"{hf_prefix}.time_conv")
    return rules


def _mid(prefix: str, channels: int) -> list[Rule]:
    p = f"{prefix}.mid_block"
    return (_residual(f"{p}.resnets.0", channels, channels) + _attention(f"{p}.attentions.0")
            + _residual(f"{p}.resnets.1", channels, channels))


def _encoder(cfg: WanVAEConfig) -> list[Rule]:
    dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
    rules = conv("encoder.conv_in", "encoder.conv_in")
    index = 0  # down_blocks is one flat list: the resnets of a level, then its downsampler
    for i, (c_in, c_out) in enumerate(itertools.pairwise(dims)):
        for j in range(cfg.num_res_blocks):
            rules += _residual(f"encoder.down_blocks.{index}", c_in if j == 0 else c_out, c_out)
            index += 1
        if i != len(cfg.dim_mult) - 1:
            mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
            p = f"encoder.down_blocks.{index}"
            rules += _resample(p, p, mode)
            index += 1
    return (rules + _mid("encoder", dims[-1]) + _gamma("encoder.norm_out", "encoder.norm_out")
            + conv("encoder.conv_out", "encoder.conv_out"))


def _decoder(cfg: WanVAEConfig) -> list[Rule]:
    mult = cfg.dim_mult
    dims = [(cfg.decoder_base_dim or cfg.base_dim) * m for m in (mult[-1], *mult[::-1])]
    temporal = tuple(reversed(cfg.temperal_downsample))
    rules = conv("decoder.conv_in", "decoder.conv_in") + _mid("decoder", dims[0])
    for i, (c_in, c_out) in enumerate(itertools.pairwise(dims)):
        c_in = c_in // 2 if i > 0 else c_in
        p = f"decoder.up_blocks.{i}"
        for j in range(cfg.num_res_blocks + 1):
            rules += _residual(f"{p}.resnets.{j}", c_in if j == 0 else c_out, c_out)
        if i != len(mult) - 1:
            mode = "upsample3d" if temporal[i] else "upsample2d"
            rules += _resample(f"{p}.upsampler", f"{p}.upsamplers.0", mode)
    return (rules + _gamma("decoder.norm_out", "decoder.norm_out")
            + conv("decoder.conv_out", "decoder.conv_out"))


def build_table(config: dict) -> list[Rule]:
    cfg = WanVAEConfig.from_dict(config)
    return (_encoder(cfg) + conv("quant_conv", "quant_conv")
            + conv("post_quant_conv", "post_quant_conv") + _decoder(cfg))


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs) -> AutoencoderKLWan:
    return AutoencoderKLWan(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


SPEC = ModelSpec(class_name="AutoencoderKLWan", build_table=build_table,
                 make_model=make_model)
