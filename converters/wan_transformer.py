"""diffusers WanTransformer3DModel <-> wfm_jax WanTransformer: the one mapping table.

The wfm_jax module tree mirrors diffusers' module names, so each rule pairs the same dotted path;
only leaf names (weight -> kernel / scale) and layouts (Linear transposed, Conv3d OIDHW ->
DHWIO) differ. The modulation tables are stored as they are.
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.wan.transformer import WanTransformer, wan_config


def _block(i: int, cfg: dict) -> list[Rule]:
    p = f"blocks.{i}"
    rules = [Rule(f"{p}.scale_shift_table", f"{p}.scale_shift_table")]
    for attn in ("attn1", "attn2"):
        for proj in ("to_q", "to_k", "to_v", "to_out.0"):
            rules += linear(f"{p}.{attn}.{proj}", f"{p}.{attn}.{proj}")
        for qk in ("norm_q", "norm_k"):
            rules += norm(f"{p}.{attn}.{qk}", f"{p}.{attn}.{qk}", bias=False)
    if cfg["cross_attn_norm"]:
        rules += norm(f"{p}.norm2", f"{p}.norm2")
    rules += linear(f"{p}.ffn.net.0.proj", f"{p}.ffn.net.0.proj")
    rules += linear(f"{p}.ffn.net.2", f"{p}.ffn.net.2")
    return rules


def build_table(config: dict) -> list[Rule]:
    cfg = wan_config(config)
    rules = conv("patch_embedding", "patch_embedding")
    ce = "condition_embedder"
    for name in ("time_embedder.linear_1", "time_embedder.linear_2", "time_proj",
                 "text_embedder.linear_1", "text_embedder.linear_2"):
        rules += linear(f"{ce}.{name}", f"{ce}.{name}")
    for i in range(cfg["num_layers"]):
        rules += _block(i, cfg)
    rules += linear("proj_out", "proj_out")
    rules.append(Rule("scale_shift_table", "scale_shift_table"))
    return rules


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs, **options):
    """options: attention_impl, remat (see WanTransformer)."""
    return WanTransformer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **options)


SPEC = ModelSpec(class_name="WanTransformer3DModel", build_table=build_table,
                 make_model=make_model)
