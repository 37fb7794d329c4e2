"""diffusers SD3Transformer2DModel <-> wfm_jax SD3Transformer: the one mapping table.

The wfm_jax module tree mirrors diffusers' module names, so every rule pairs the same dotted
prefix on both sides; only the leaf names (weight -> kernel/scale) and layouts differ.
"""
from __future__ import annotations

import jax.numpy as jnp

from converters.registry import ModelSpec
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.sd3.transformer import SD3Transformer, sd3_config


def _lin(name: str) -> list[Rule]:
    return linear(name, name)


def _qk_norms(prefix: str, kind: str | None, names: tuple[str, ...]) -> list[Rule]:
    if kind == "rms_norm":  # RMSNorm: weight only
        return [r for n in names for r in norm(f"{prefix}.{n}", f"{prefix}.{n}", bias=False)]
    if kind == "layer_norm":  # affine LayerNorm: weight and bias
        return [r for n in names for r in norm(f"{prefix}.{n}", f"{prefix}.{n}")]
    return []  # None or fp32_layer_norm: no parameters


def _block(i: int, cfg: dict) -> list[Rule]:
    p = f"transformer_blocks.{i}"
    last = i == cfg["num_layers"] - 1
    dual = i in cfg["dual_attention_layers"]
    qk = cfg["qk_norm"]
    rules = _lin(f"{p}.norm1.linear") + _lin(f"{p}.norm1_context.linear")
    attn = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj"]
    if not last:  # the context_pre_only block has no context output projection
        attn.append("to_add_out")
    for name in attn:
        rules += _lin(f"{p}.attn.{name}")
    rules += _qk_norms(f"{p}.attn", qk, ("norm_q", "norm_k", "norm_added_q", "norm_added_k"))
    if dual:
        for name in ("to_q", "to_k", "to_v", "to_out.0"):
            rules += _lin(f"{p}.attn2.{name}")
        rules += _qk_norms(f"{p}.attn2", qk, ("norm_q", "norm_k"))
    streams = ("ff",) if last else ("ff", "ff_context")
    for ff in streams:
        rules += _lin(f"{p}.{ff}.net.0.proj") + _lin(f"{p}.{ff}.net.2")
    return rules


def build_table(config: dict) -> list[Rule]:
    cfg = sd3_config(config)
    rules = conv("pos_embed.proj", "pos_embed.proj")
    if cfg["pos_embed_max_size"]:  # a persistent buffer in diffusers only in this case
        rules.append(Rule("pos_embed.pos_embed", "pos_embed.pos_embed"))
    for emb in ("timestep_embedder", "text_embedder"):
        for layer in ("linear_1", "linear_2"):
            rules += _lin(f"time_text_embed.{emb}.{layer}")
    rules += _lin("context_embedder")
    for i in range(cfg["num_layers"]):
        rules += _block(i, cfg)
    rules += _lin("norm_out.linear") + _lin("proj_out")
    return rules


def make_model(config: dict, *, dtype=None, param_dtype=jnp.float32, rngs, **options):
    """options: attention_impl, remat (see SD3Transformer)."""
    return SD3Transformer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **options)


SPEC = ModelSpec(class_name="SD3Transformer2DModel", build_table=build_table,
                 make_model=make_model)
