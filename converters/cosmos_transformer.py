"""diffusers CosmosTransformer3DModel <-> wfm_jax CosmosTransformer: the one mapping table.

The wfm_jax module tree mirrors diffusers' module names, so each rule pairs the same dotted path;
only leaf names (weight -> kernel / scale) and the Linear layout (transposed) differ. Every
Cosmos projection is bias-free except `crossattn_proj.0`.
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, linear, norm
from wfm_jax.models.cosmos.transformer import CosmosTransformer, cosmos_config


def _ada_norm(prefix: str) -> list[Rule]:
    return linear(f"{prefix}.linear_1", f"{prefix}.linear_1", bias=False) + \
        linear(f"{prefix}.linear_2", f"{prefix}.linear_2", bias=False)


def _block(i: int) -> list[Rule]:
    p = f"transformer_blocks.{i}"
    rules = []
    for n in ("norm1", "norm2", "norm3"):
        rules += _ada_norm(f"{p}.{n}")
    for attn in ("attn1", "attn2"):
        for proj in ("to_q", "to_k", "to_v", "to_out.0"):
            rules += linear(f"{p}.{attn}.{proj}", f"{p}.{attn}.{proj}", bias=False)
        for qk in ("norm_q", "norm_k"):
            rules += norm(f"{p}.{attn}.{qk}", f"{p}.{attn}.{qk}", bias=False)
    rules += linear(f"{p}.ff.net.0.proj", f"{p}.ff.net.0.proj", bias=False)
    rules += linear(f"{p}.ff.net.2", f"{p}.ff.net.2", bias=False)
    return rules


def build_table(config: dict) -> list[Rule]:
    cfg = cosmos_config(config)
    rules = linear("patch_embed.proj", "patch_embed.proj", bias=False)
    rules += linear("time_embed.t_embedder.linear_1", "time_embed.t_embedder.linear_1", bias=False)
    rules += linear("time_embed.t_embedder.linear_2", "time_embed.t_embedder.linear_2", bias=False)
    rules += norm("time_embed.norm", "time_embed.norm", bias=False)
    for i in range(cfg["num_layers"]):
        rules += _block(i)
    rules += _ada_norm("norm_out")
    rules += linear("proj_out", "proj_out", bias=False)
    if cfg["use_crossattn_projection"]:
        rules += linear("crossattn_proj.0", "crossattn_proj.0")
    return rules


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs, **options):
    """options: attention_impl, remat (see CosmosTransformer)."""
    return CosmosTransformer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **options)


SPEC = ModelSpec(class_name="CosmosTransformer3DModel", build_table=build_table,
                 make_model=make_model)
