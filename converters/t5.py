"""transformers T5EncoderModel / UMT5EncoderModel <-> wfm_jax T5Encoder: one table, both ways.

UMT5 differs only in the per-layer relative_attention_bias (`build_umt5_table`).

transformers ties `encoder.embed_tokens.weight` to `shared.weight` and save_pretrained writes only
the latter; the table maps `shared.weight`. Checkpoints that store the copy too (or only the copy)
load through `SPEC.tied_copies` (converters.tied); `drop_tied_copy` does the same for in-memory
loaders.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from converters.registry import ModelSpec
from converters.table import Rule, linear
from converters.tied import check_equal
from wfm_jax.models.text.t5 import T5Config, make_model, make_umt5_model

TIED_COPY = "encoder.embed_tokens.weight"
SHARED = "shared.weight"


def _bias_key(i: int) -> str:
    return f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight"


def build_umt5_table(config: Mapping[str, Any]) -> list[Rule]:
    cfg = T5Config.from_dict(config)
    return build_table(config, shared_bias=False) + [
        Rule(f"blocks.{i}.relative_attention_bias", _bias_key(i)) for i in range(cfg.num_layers)]


def build_table(config: Mapping[str, Any], shared_bias: bool = True) -> list[Rule]:
    cfg = T5Config.from_dict(config)
    table = [Rule("shared", SHARED)]
    if shared_bias:
        table.append(Rule("relative_attention_bias", _bias_key(0)))
    ffn = ("wi_0", "wi_1", "wo") if cfg.is_gated else ("wi", "wo")
    for i in range(cfg.num_layers):
        jax, hf = f"blocks.{i}", f"encoder.block.{i}.layer"
        for proj in ("q", "k", "v", "o"):
            table += linear(f"{jax}.attn.{proj}", f"{hf}.0.SelfAttention.{proj}", bias=False)
        table.append(Rule(f"{jax}.attn_norm.scale", f"{hf}.0.layer_norm.weight"))
        for proj in ffn:
            table += linear(f"{jax}.ff.{proj}", f"{hf}.1.DenseReluDense.{proj}", bias=False)
        table.append(Rule(f"{jax}.ff_norm.scale", f"{hf}.1.layer_norm.weight"))
    table.append(Rule("final_layer_norm.scale", "encoder.final_layer_norm.weight"))
    return table


def drop_tied_copy(loaders: Mapping[str, Callable]) -> dict[str, Callable]:
    """Checkpoint keys -> loaders with the tied embedding copy folded into `shared.weight`
    (when both are stored, loading it checks they hold the same values)."""
    out = dict(loaders)
    if TIED_COPY not in out:
        return out
    copy = out.pop(TIED_COPY)
    if SHARED not in out:
        out[SHARED] = copy
        return out
    shared = out[SHARED]

    def checked():
        value = shared()
        check_equal(SHARED, TIED_COPY, value, copy())
        return value

    out[SHARED] = checked
    return out


SPEC = ModelSpec(class_name="T5EncoderModel", build_table=build_table,
                 make_model=make_model, weights_stem="model",
                 tied_copies=((TIED_COPY, SHARED),))
UMT5_SPEC = ModelSpec(class_name="UMT5EncoderModel", build_table=build_umt5_table,
                      make_model=make_umt5_model, weights_stem="model",
                      tied_copies=((TIED_COPY, SHARED),))
