"""transformers Qwen3VLForConditionalGeneration <-> wfm_jax Qwen3VLForConditionalGeneration: one
table drives both directions, plus an export that `Qwen3VLForConditionalGeneration.from_pretrained`
loads (model.safetensors + config.json + generation_config.json, processor files copied).

Keys are the layout transformers 5 writes and the released Qwen3-VL / Cosmos-Reason2 checkpoints
hold: `model.visual.*`, `model.language_model.*`, `lm_head.weight` (absent when tied). The wfm_jax
module tree spells the same paths; only leaf names (weight -> kernel / scale) and layouts (Linear
transposed, Conv3d OIDHW -> DHWIO) differ. A tied checkpoint that also stores lm_head.weight
folds it into the embeddings (equal values required, converters.tied).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from converters.registry import ModelSpec
from converters.table import Rule, conv, convert_to_diffusers, convert_to_jax, linear, norm
from converters.tied import check_equal
from wfm_jax.io.atomic import atomic_directory
from wfm_jax.models.qwen3_vl.config import Qwen3VLConfig, as_config
from wfm_jax.models.qwen3_vl.model import make_model

# copied unchanged from the base checkpoint into an export, when present
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "tokenizer.json",
                   "tokenizer_config.json", "chat_template.json", "chat_template.jinja",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt")
_TIED = (("lm_head.weight", "model.language_model.embed_tokens.weight"),)


def _merger(jax: str, hf: str) -> list[Rule]:
    return norm(f"{jax}.norm", f"{hf}.norm") + linear(f"{jax}.linear_fc1", f"{hf}.linear_fc1") + \
        linear(f"{jax}.linear_fc2", f"{hf}.linear_fc2")


def vision_table(cfg: Qwen3VLConfig) -> list[Rule]:
    v = "model.visual"
    rules = conv(f"{v}.patch_embed.proj", f"{v}.patch_embed.proj")
    rules.append(Rule(f"{v}.pos_embed", f"{v}.pos_embed.weight"))
    for i in range(cfg.vision.depth):
        p = f"{v}.blocks.{i}"
        rules += norm(f"{p}.norm1", f"{p}.norm1") + norm(f"{p}.norm2", f"{p}.norm2")
        rules += linear(f"{p}.attn.qkv", f"{p}.attn.qkv") + linear(f"{p}.attn.proj", f"{p}.attn.proj")
        rules += linear(f"{p}.mlp.linear_fc1", f"{p}.mlp.linear_fc1")
        rules += linear(f"{p}.mlp.linear_fc2", f"{p}.mlp.linear_fc2")
    rules += _merger(f"{v}.merger", f"{v}.merger")
    for j in range(len(cfg.vision.deepstack_visual_indexes)):
        rules += _merger(f"{v}.deepstack_merger_list.{j}", f"{v}.deepstack_merger_list.{j}")
    return rules


def text_table(cfg: Qwen3VLConfig) -> list[Rule]:
    t = "model.language_model"
    bias = cfg.text.attention_bias
    rules = [Rule(f"{t}.embed_tokens", f"{t}.embed_tokens.weight")]
    for i in range(cfg.text.num_hidden_layers):
        p = f"{t}.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rules += linear(f"{p}.self_attn.{proj}", f"{p}.self_attn.{proj}", bias=bias)
        rules += norm(f"{p}.self_attn.q_norm", f"{p}.self_attn.q_norm", bias=False)
        rules += norm(f"{p}.self_attn.k_norm", f"{p}.self_attn.k_norm", bias=False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            rules += linear(f"{p}.mlp.{proj}", f"{p}.mlp.{proj}", bias=False)
        rules += norm(f"{p}.input_layernorm", f"{p}.input_layernorm", bias=False)
        rules += norm(f"{p}.post_attention_layernorm", f"{p}.post_attention_layernorm", bias=False)
    rules += norm(f"{t}.norm", f"{t}.norm", bias=False)
    if not cfg.tie_word_embeddings:
        rules += linear("lm_head", "lm_head", bias=False)
    return rules


def build_table(config: Mapping[str, Any] | Qwen3VLConfig) -> list[Rule]:
    cfg = as_config(config)
    return vision_table(cfg) + text_table(cfg)


SPEC = ModelSpec(class_name="Qwen3VLForConditionalGeneration", build_table=build_table,
                 make_model=make_model, weights_stem="model", tied_copies=_TIED)


def generation_config(cfg: Qwen3VLConfig) -> dict:
    extra = dict(cfg.text_extra)
    out = {k: extra[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in extra}
    return {**out, "do_sample": False}


def export(model, dst: str, *, dtype=None, processor_dir: str | None = None,
           max_shard_bytes: int = 2 << 30) -> None:
    """Write `model` as a transformers Qwen3-VL directory, all or nothing (a temp dir, renamed).

    dtype: e.g. numpy / ml_dtypes bfloat16 to store bf16 (config `dtype` says so); processor_dir:
    the base checkpoint whose tokenizer / processor / chat template files are copied unchanged.
    """
    from converters.loading import export_diffusers  # the shared streaming writer

    if processor_dir is not None and not os.path.isdir(processor_dir):
        raise FileNotFoundError(f"no such processor directory: {processor_dir}")
    cfg: Qwen3VLConfig = model.config
    config = cfg.to_dict()
    config["dtype"] = "bfloat16" if dtype is not None and "bfloat16" in str(dtype) else "float32"
    if jax.process_index() != 0:  # takes part in the parameter gathers, writes nothing
        export_diffusers(model, config, dst, dtype=dtype, max_shard_bytes=max_shard_bytes)
        return
    with atomic_directory(dst) as tmp:
        weights = os.path.join(tmp, "weights")
        export_diffusers(model, config, weights, dtype=dtype, max_shard_bytes=max_shard_bytes)
        for name in os.listdir(weights):
            os.replace(os.path.join(weights, name), os.path.join(tmp, name))
        os.rmdir(weights)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(generation_config(cfg), f, indent=2)
        for name in PROCESSOR_FILES if processor_dir is not None else ():
            src = os.path.join(processor_dir, name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(tmp, name))


def _variables(model) -> dict:
    return {".".join(str(k) for k in path): var
            for path, var in nnx.state(model, nnx.Param).flat_state()}


def load_tensors(model, tensors: Mapping[str, np.ndarray]) -> None:
    """Fill `model` (concrete, or abstract from nnx.eval_shape) in place from transformers
    tensors (key -> array) on the default device; missing, unexpected or mis-shaped keys raise
    ConversionError naming them. Large checkpoints: `converters.loading.load_model` reads
    them tensor by tensor straight into their shards."""
    cfg: Qwen3VLConfig = model.config
    tensors = dict(tensors)
    if cfg.tie_word_embeddings and _TIED[0][0] in tensors:  # a tied copy stored as well
        copy = tensors.pop(_TIED[0][0])
        if _TIED[0][1] in tensors:
            check_equal(_TIED[0][1], _TIED[0][0], tensors[_TIED[0][1]], copy)
        else:
            tensors[_TIED[0][1]] = copy
    variables = _variables(model)
    flat = convert_to_jax(build_table(cfg), {k: (lambda v=v: np.asarray(v)) for k, v in tensors.items()},
                          {k: tuple(v.shape) for k, v in variables.items()})
    for path, value in flat.items():
        var = variables[path]  # may be abstract (nnx.eval_shape): set, not update in place
        var.set_value(jnp.asarray(value, dtype=var.get_value().dtype))


def state_tensors(model) -> dict[str, np.ndarray]:
    """The model's parameters as transformers tensors (key -> numpy array, stored dtype)."""
    flat = {k: np.asarray(jax.device_get(v[...])) for k, v in _variables(model).items()}
    return convert_to_diffusers(build_table(model.config), flat)
