"""transformers Qwen2_5_VLForConditionalGeneration <-> wfm_jax Qwen2_5_VLEncoder: one table, both
ways. This is the class diffusers' Cosmos-Predict2.5 pipeline loads as `text_encoder`.

Keys are the layout save_pretrained writes and the released checkpoints (Cosmos-Reason1-7B,
Qwen2.5-VL-*) hold: `model.embed_tokens`, `model.layers.N.*`, `model.norm`, `visual.*`,
`lm_head.weight` (transformers renames them to `model.language_model.*` / `model.visual.*` in
memory only; a checkpoint stored in that in-memory layout is refused by the strict key check).

The text tower is converted; the vision tower and an untied lm_head are not computed with but are
part of the checkpoint: they map one to one, unchanged, onto `passthrough.<checkpoint key>`
(wfm_jax.models.text.qwen2_5_vl.Passthrough variables), so a checkpoint with its visual tower
loads and exports back bit for bit. A checkpoint lacking any of them is refused like any
missing key (the table is built from the config's vision_config).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from converters.registry import ModelSpec
from converters.table import Rule, linear
from wfm_jax.models.text.qwen2_5_vl import QwenTextConfig, make_model, passthrough_shapes


def build_text_table(config: Mapping[str, Any], prefix: str = "language_model.") -> list[Rule]:
    """The text tower's rules; `prefix` is its path in the wfm_jax model ("" for QwenTextModel)."""
    cfg = QwenTextConfig.from_dict(config)
    table = [Rule(f"{prefix}embed_tokens", "model.embed_tokens.weight")]
    for i in range(cfg.num_hidden_layers):
        jax, hf = f"{prefix}layers.{i}", f"model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj"):
            table += linear(f"{jax}.self_attn.{proj}", f"{hf}.self_attn.{proj}")
        table += linear(f"{jax}.self_attn.o_proj", f"{hf}.self_attn.o_proj", bias=False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            table += linear(f"{jax}.mlp.{proj}", f"{hf}.mlp.{proj}", bias=False)
        table.append(Rule(f"{jax}.input_layernorm.scale", f"{hf}.input_layernorm.weight"))
        table.append(Rule(f"{jax}.post_attention_layernorm.scale",
                          f"{hf}.post_attention_layernorm.weight"))
    table.append(Rule(f"{prefix}norm.scale", "model.norm.weight"))
    return table


def build_table(config: Mapping[str, Any]) -> list[Rule]:
    return build_text_table(config) + [Rule(f"passthrough.{key}", key)
                                       for key in passthrough_shapes(config)]


SPEC = ModelSpec(class_name="Qwen2_5_VLForConditionalGeneration",
                 build_table=build_table, make_model=make_model, weights_stem="model")
