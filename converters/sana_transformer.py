"""diffusers SanaTransformer2DModel / SanaVideoTransformer3DModel <-> wfm_jax SanaTransformer /
SanaVideoTransformer: the one mapping table for each.

The wfm_jax module tree mirrors diffusers' module names, so each rule pairs the same dotted path;
only leaf names (weight -> kernel / scale) and layouts differ: Linear transposed, every conv
(1x1, depthwise 3x3, the (3, 1) temporal one, the patch embeddings) torch O I ... -> ... I O.
The modulation tables are stored as they are.
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.sana import SanaTransformer, SanaVideoTransformer, sana_config, sana_video_config


def _attention(p: str, cfg: dict, qkv_bias: bool) -> list[Rule]:
    rules = []
    for proj in ("to_q", "to_k", "to_v"):
        rules += linear(f"{p}.{proj}", f"{p}.{proj}", bias=qkv_bias)
    rules += linear(f"{p}.to_out.0", f"{p}.to_out.0")
    if cfg["qk_norm"]:
        for qk in ("norm_q", "norm_k"):
            rules += norm(f"{p}.{qk}", f"{p}.{qk}", bias=False)
    return rules


def _block(i: int, cfg: dict, video: bool) -> list[Rule]:
    p = f"transformer_blocks.{i}"
    rules = [Rule(f"{p}.scale_shift_table", f"{p}.scale_shift_table")]
    rules += _attention(f"{p}.attn1", cfg, cfg["attention_bias"])
    rules += _attention(f"{p}.attn2", cfg, True)
    if cfg["norm_elementwise_affine"]:
        rules += norm(f"{p}.norm2", f"{p}.norm2")
    rules += conv(f"{p}.ff.conv_inverted", f"{p}.ff.conv_inverted")
    rules += conv(f"{p}.ff.conv_depth", f"{p}.ff.conv_depth")
    rules += conv(f"{p}.ff.conv_point", f"{p}.ff.conv_point", bias=False)
    if video:
        rules += conv(f"{p}.ff.conv_temp", f"{p}.ff.conv_temp", bias=False)
    return rules


def _table(cfg: dict, video: bool, patch: str) -> list[Rule]:
    rules = conv(patch, patch)
    if cfg["guidance_embeds"]:
        embedders = ("timestep_embedder", "guidance_embedder")
    else:
        embedders = ("emb.timestep_embedder",)
    for emb in embedders:
        for layer in ("linear_1", "linear_2"):
            rules += linear(f"time_embed.{emb}.{layer}", f"time_embed.{emb}.{layer}")
    rules += linear("time_embed.linear", "time_embed.linear")
    for layer in ("linear_1", "linear_2"):
        rules += linear(f"caption_projection.{layer}", f"caption_projection.{layer}")
    rules += norm("caption_norm", "caption_norm", bias=False)
    for i in range(cfg["num_layers"]):
        rules += _block(i, cfg, video)
    rules += linear("proj_out", "proj_out")
    rules.append(Rule("scale_shift_table", "scale_shift_table"))
    return rules


def build_table(config: dict) -> list[Rule]:
    return _table(sana_config(config), False, "patch_embed.proj")


def build_video_table(config: dict) -> list[Rule]:
    return _table(sana_video_config(config), True, "patch_embedding")


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs, **options):
    """options: attention_impl, remat (see SanaTransformer)."""
    return SanaTransformer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **options)


def make_video_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs, **options):
    return SanaVideoTransformer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                                **options)


SPEC = ModelSpec(class_name="SanaTransformer2DModel", build_table=build_table,
                 make_model=make_model)
VIDEO_SPEC = ModelSpec(class_name="SanaVideoTransformer3DModel",
                       build_table=build_video_table, make_model=make_video_model)
