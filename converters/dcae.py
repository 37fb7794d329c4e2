"""AutoencoderDC (SANA's DC-AE): diffusers keys <-> wfm_jax state paths, one table for both
directions.

The model keeps diffusers' module names and numbering, so each rule pairs a path with the same
path; the table walks the same config the model is built from (`DCAEConfig`).
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.dcae.autoencoder_dc import AutoencoderDC, DCAEConfig


def _same(make, path: str, **kw) -> list[Rule]:
    return make(path, path, **kw)


def _res_block(p: str) -> list[Rule]:
    return (_same(conv, f"{p}.conv1") + _same(conv, f"{p}.conv2", bias=False)
            + _same(norm, f"{p}.norm"))


def _vit_block(p: str, multiscales: tuple) -> list[Rule]:
    a = f"{p}.attn"
    rules = []
    for name in ("to_q", "to_k", "to_v"):
        rules += _same(linear, f"{a}.{name}", bias=False)
    for k in range(len(multiscales)):
        for name in ("proj_in", "proj_out"):
            rules += _same(conv, f"{a}.to_qkv_multiscale.{k}.{name}", bias=False)
    rules += _same(linear, f"{a}.to_out", bias=False) + _same(norm, f"{a}.norm_out")
    c = f"{p}.conv_out"
    return (rules + _same(conv, f"{c}.conv_inverted") + _same(conv, f"{c}.conv_depth")
            + _same(conv, f"{c}.conv_point", bias=False) + _same(norm, f"{c}.norm"))


def _block(p: str, block_type: str, multiscales: tuple) -> list[Rule]:
    return _res_block(p) if block_type == "ResBlock" else _vit_block(p, multiscales)


def build_table(config: dict) -> list[Rule]:
    cfg = DCAEConfig.from_dict(config)
    rules = []

    chans, layers = cfg.encoder_block_out_channels, cfg.encoder_layers_per_block
    rules += _same(conv, "encoder.conv_in" if layers[0] > 0 else "encoder.conv_in.conv")
    for i, n in enumerate(layers):
        p = f"encoder.down_blocks.{i}"
        for j in range(n):
            rules += _block(f"{p}.{j}", cfg.encoder_block_types[i], cfg.encoder_qkv_multiscales[i])
        if i < len(chans) - 1 and n > 0:
            rules += _same(conv, f"{p}.{n}.conv")
    rules += _same(conv, "encoder.conv_out")

    chans, layers = cfg.decoder_block_out_channels, cfg.decoder_layers_per_block
    rules += _same(conv, "decoder.conv_in")
    for i, n in enumerate(layers):
        p = f"decoder.up_blocks.{i}"
        first = 0
        if i < len(chans) - 1 and n > 0:
            rules += _same(conv, f"{p}.0.conv")
            first = 1
        for j in range(n):
            rules += _block(f"{p}.{first + j}", cfg.decoder_block_types[i],
                            cfg.decoder_qkv_multiscales[i])
    rules += _same(norm, "decoder.norm_out")
    rules += _same(conv, "decoder.conv_out" if layers[0] > 0 else "decoder.conv_out.conv")
    return rules


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs) -> AutoencoderDC:
    return AutoencoderDC(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


SPEC = ModelSpec(class_name="AutoencoderDC", build_table=build_table,
                 make_model=make_model)
