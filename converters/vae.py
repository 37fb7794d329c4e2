"""AutoencoderKL (SD3 VAE): diffusers keys <-> wfm_jax state paths, one table for both directions.

The table walks the same config the model is built from (`VAEConfig`), so a config change that
adds or removes a layer changes both at once.
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.vae.autoencoder_kl import AutoencoderKL, VAEConfig
from wfm_jax.models.vae.blocks import pairs


def _resnet(jax_prefix: str, hf_prefix: str, c_in: int, c_out: int) -> list[Rule]:
    rules = []
    for name, make in (("norm1", norm), ("conv1", conv), ("norm2", norm), ("conv2", conv)):
        rules += make(f"{jax_prefix}.{name}", f"{hf_prefix}.{name}")
    if c_in != c_out:
        rules += conv(f"{jax_prefix}.conv_shortcut", f"{hf_prefix}.conv_shortcut")
    return rules


def _resnets(jax_prefix: str, hf_prefix: str, c_in: int, c_out: int, count: int) -> list[Rule]:
    rules = []
    for i in range(count):
        rules += _resnet(f"{jax_prefix}.resnets.{i}", f"{hf_prefix}.resnets.{i}",
                         c_in if i == 0 else c_out, c_out)
    return rules


def _mid_block(prefix: str, channels: int, attention: bool) -> list[Rule]:
    rules = _resnets(f"{prefix}.mid_block", f"{prefix}.mid_block", channels, channels, 2)
    if attention:
        jp, hp = f"{prefix}.mid_block.attention", f"{prefix}.mid_block.attentions.0"
        rules += norm(f"{jp}.group_norm", f"{hp}.group_norm")
        for name in ("to_q", "to_k", "to_v"):
            rules += linear(f"{jp}.{name}", f"{hp}.{name}")
        rules += linear(f"{jp}.to_out", f"{hp}.to_out.0")
    return rules


def _stem_and_head(prefix: str) -> list[Rule]:
    return (conv(f"{prefix}.conv_in", f"{prefix}.conv_in")
            + norm(f"{prefix}.conv_norm_out", f"{prefix}.conv_norm_out")
            + conv(f"{prefix}.conv_out", f"{prefix}.conv_out"))


def build_table(config: dict) -> list[Rule]:
    cfg = VAEConfig.from_dict(config)
    rules = _stem_and_head("encoder") + _stem_and_head("decoder")

    chans = cfg.block_out_channels
    for i, (c_in, c_out) in enumerate(pairs(chans)):
        p = f"encoder.down_blocks.{i}"
        rules += _resnets(p, p, c_in, c_out, cfg.layers_per_block)
        if i < len(chans) - 1:
            rules += conv(f"{p}.downsample.conv", f"{p}.downsamplers.0.conv")
    rules += _mid_block("encoder", chans[-1], cfg.mid_block_add_attention)

    rev = tuple(reversed(chans))
    rules += _mid_block("decoder", rev[0], cfg.mid_block_add_attention)
    for i, (c_in, c_out) in enumerate(pairs(rev)):
        p = f"decoder.up_blocks.{i}"
        rules += _resnets(p, p, c_in, c_out, cfg.layers_per_block + 1)
        if i < len(rev) - 1:
            rules += conv(f"{p}.upsample.conv", f"{p}.upsamplers.0.conv")

    if cfg.use_quant_conv:
        rules += conv("quant_conv", "quant_conv")
    if cfg.use_post_quant_conv:
        rules += conv("post_quant_conv", "post_quant_conv")
    return rules


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs) -> AutoencoderKL:
    return AutoencoderKL(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


SPEC = ModelSpec(class_name="AutoencoderKL", build_table=build_table,
                 make_model=make_model)
