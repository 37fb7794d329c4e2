"""Which wfm_jax model and mapping table serve a diffusers/transformers class name.

COMPONENTS names every converter module's `ModelSpec` as a lazy "module:attr" string (nothing
registers itself on import, and `import converters` stays light); the CLI and the loaders look
the class up here, so an unsupported class fails with one line naming it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from converters.table import Rule
from wfm_jax.core.errors import UserError
from wfm_jax.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    class_name: str  # config.json "_class_name" (diffusers) or "architectures"[0] (transformers)
    build_table: Callable[[dict], list[Rule]]  # config dict -> mapping table
    # (config dict, *, dtype, param_dtype, rngs) -> NNX module; build under nnx.eval_shape to get
    # an abstract model.
    make_model: Callable[..., object]
    weights_stem: str = "diffusion_pytorch_model"  # "model" for transformers checkpoints
    # (copy key, table key) pairs of tied weights a checkpoint may store under either key or
    # both (converters.tied folds them)
    tied_copies: tuple[tuple[str, str], ...] = ()


COMPONENTS: Registry[ModelSpec] = Registry("model class", {
    "SD3Transformer2DModel": "converters.sd3_transformer:SPEC",
    "AutoencoderKL": "converters.vae:SPEC",
    "AutoencoderKLWan": "converters.wan_vae:SPEC",
    "AutoencoderDC": "converters.dcae:SPEC",
    "CLIPTextModelWithProjection": "converters.clip:SPEC",
    "T5EncoderModel": "converters.t5:SPEC",
    "UMT5EncoderModel": "converters.t5:UMT5_SPEC",
    "WanTransformer3DModel": "converters.wan_transformer:SPEC",
    "CosmosTransformer3DModel": "converters.cosmos_transformer:SPEC",
    "SanaTransformer2DModel": "converters.sana_transformer:SPEC",
    "SanaVideoTransformer3DModel": "converters.sana_transformer:VIDEO_SPEC",
    "Qwen2_5_VLForConditionalGeneration": "converters.qwen2_5_vl:SPEC",
    "Gemma2Model": "converters.gemma2:SPEC",
    "Qwen3VLForConditionalGeneration": "converters.qwen3_vl:SPEC",
})


class UnsupportedModelError(UserError, ValueError):
    """config.json names a class no converter handles (the message names the class)."""


def register(spec: ModelSpec) -> ModelSpec:
    """Add (or replace) a spec under its class name: for tests and users' own models."""
    COMPONENTS.register(spec.class_name, spec, replace=True)
    return spec


def class_name_of(config: dict) -> str:
    if "_class_name" in config:
        return config["_class_name"]
    archs = config.get("architectures") or []
    return archs[0] if archs else "<no _class_name or architectures in config.json>"


def spec_for(config: dict) -> ModelSpec:
    name = class_name_of(config)
    if name not in COMPONENTS:
        hint = COMPONENTS.closest(name)
        raise UnsupportedModelError(
            f"unsupported model class {name!r}" + (f" (did you mean {hint!r}?)" if hint else "")
            + f"; supported: {', '.join(COMPONENTS.names())}")
    return COMPONENTS.get(name)
