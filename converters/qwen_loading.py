"""Load only the text tower of a Qwen2_5_VLForConditionalGeneration checkpoint.

`converters.loading.load_model` loads the whole checkpoint (the text tower plus the vision
tower and lm_head as passthrough variables, so an export is bit-exact). An encoder that only
embeds prompts needs none of those: for Cosmos-Reason1-7B they are ~1.2B parameters the devices
would hold for nothing. This loader reads the text tower's tensors alone, straight into their
shards, from a transformers checkpoint (the vision/lm_head keys may be there or not; any other
unknown key is still refused) or from a wfm_jax state dir written by `python -m converters`.
"""
from __future__ import annotations

import os

import jax.numpy as jnp
from flax import nnx

from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.text.qwen2_5_vl import QwenTextModel, make_text_model, passthrough_shapes

CLASS_NAME = "Qwen2_5_VLForConditionalGeneration"
STATE_PREFIX = "language_model."  # the text tower's paths in a converted (full-model) state


def load_text_tower(path: str, *, component: str = "text_encoder", dtype=None,
                    param_dtype=jnp.float32, mesh=None, rules=None) -> tuple[QwenTextModel, dict]:
    """(text tower, config.json) from a model dir, a pipeline dir (its `component`) or a wfm_jax
    state dir; `mesh`/`rules` place each tensor in its shards as load_model does."""
    from converters import jax_state, loading, registry
    from converters.qwen2_5_vl import build_text_table
    from converters.safetensors_io import open_checkpoint_slices
    from converters.table import ConversionError

    directory = loading.resolve_model_dir(path, component)
    config = loading.read_json(os.path.join(directory, "config.json"))
    if registry.class_name_of(config) != CLASS_NAME:
        raise registry.UnsupportedModelError(
            f"{directory} holds {registry.class_name_of(config)!r}, not a {CLASS_NAME}")
    model = abstract_module(lambda: make_text_model(config, dtype=dtype, param_dtype=param_dtype,
                                                    rngs=nnx.Rngs(0)))
    shardings = loading.model_shardings(model, mesh, rules)
    variables = loading.all_variables(model)

    if jax_state.is_state_dir(directory):
        meta = jax_state.state_meta(directory)
        keys = [STATE_PREFIX + k for k in variables]
        missing = [k for k in keys if k not in meta]
        if missing:
            raise ConversionError(f"state lacks: {loading.name_list(missing)}")
        wrong = [f"{STATE_PREFIX}{k} {meta[STATE_PREFIX + k][0]} (model {tuple(v.shape)})"
                 for k, v in variables.items() if tuple(meta[STATE_PREFIX + k][0]) != v.shape]
        if wrong:
            raise ConversionError(f"wrong shape for {len(wrong)} path(s): "
                                  f"{loading.name_list(wrong)}")
        arrays = jax_state.restore_state(
            directory, keys=keys, shardings={STATE_PREFIX + k: shardings[k] for k in variables},
            dtypes={STATE_PREFIX + k: v.dtype for k, v in variables.items()})
        for key, var in variables.items():
            var.set_value(arrays[STATE_PREFIX + key])
        return model, config

    table = build_text_table(config, prefix="")
    # the vision tower and lm_head (tied or not, stored or not) are never read
    skipped = set(passthrough_shapes(config)) | {"lm_head.weight"}
    meta = {k: v for k, v in loading.stored_keys(directory).meta.items() if k not in skipped}
    loading.check_against_model(table, meta, model)
    with open_checkpoint_slices(directory) as readers:
        for rule in table:
            var = variables[rule.jax]
            var.set_value(loading.load_tensor(readers[rule.hf], rule, var.shape, var.dtype,
                                              shardings[rule.jax]))
    return model, config
