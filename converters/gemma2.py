"""transformers Gemma2Model (SANA's text encoder) <-> wfm_jax Gemma2Model: one table, both ways.

Keys are Gemma2Model's own (`embed_tokens.weight`, `layers.{i}...`, `norm.weight`), as SANA's
`text_encoder/` folder stores them. Norm weights are stored as w in x / rms(x) * (1 + w): they
map unchanged.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from converters.registry import ModelSpec
from converters.table import Rule, linear
from wfm_jax.models.text.gemma2 import Gemma2Config, make_model

NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
         "post_feedforward_layernorm")


def build_table(config: Mapping[str, Any]) -> list[Rule]:
    cfg = Gemma2Config.from_dict(config)
    table = [Rule("embed_tokens", "embed_tokens.weight")]
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            table += linear(f"{p}.self_attn.{proj}", f"{p}.self_attn.{proj}",
                            bias=cfg.attention_bias)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            table += linear(f"{p}.mlp.{proj}", f"{p}.mlp.{proj}", bias=False)
        table += [Rule(f"{p}.{n}.scale", f"{p}.{n}.weight") for n in NORMS]
    table.append(Rule("norm.scale", "norm.weight"))
    return table


SPEC = ModelSpec(class_name="Gemma2Model", build_table=build_table,
                 make_model=make_model, weights_stem="model")
