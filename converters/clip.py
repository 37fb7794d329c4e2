"""transformers CLIPTextModelWithProjection <-> wfm_jax CLIPTextEncoder: one table, both ways."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from converters.registry import ModelSpec
from converters.table import Rule, linear, norm
from wfm_jax.models.text.clip import CLIPTextConfig, make_model


def build_table(config: Mapping[str, Any]) -> list[Rule]:
    cfg = CLIPTextConfig.from_dict(config)
    tm = "text_model"
    table = [
        Rule("token_embedding", f"{tm}.embeddings.token_embedding.weight"),
        Rule("position_embedding", f"{tm}.embeddings.position_embedding.weight"),
    ]
    for i in range(cfg.num_hidden_layers):
        jax, hf = f"layers.{i}", f"{tm}.encoder.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            table += linear(f"{jax}.self_attn.{proj}", f"{hf}.self_attn.{proj}")
        table += norm(f"{jax}.layer_norm1", f"{hf}.layer_norm1")
        table += norm(f"{jax}.layer_norm2", f"{hf}.layer_norm2")
        table += linear(f"{jax}.mlp.fc1", f"{hf}.mlp.fc1")
        table += linear(f"{jax}.mlp.fc2", f"{hf}.mlp.fc2")
    table += norm("final_layer_norm", f"{tm}.final_layer_norm")
    table += linear("text_projection", "text_projection", bias=False)
    return table


SPEC = ModelSpec(class_name="CLIPTextModelWithProjection", build_table=build_table,
                 make_model=make_model, weights_stem="model")
