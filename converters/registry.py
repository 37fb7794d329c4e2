"""Which wfm_jax model and mapping table serve a diffusers/transformers class name.

Each model family registers a `ModelSpec` from its converter module; the CLI and the loaders look
the class up here, so an unsupported class fails with one line naming it.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from converters.table import Rule

# Modules that register specs on import (kept lazy so `import converters` stays light).
_PROVIDERS = (
    "converters.sd3_transformer",
    "converters.vae",
    "converters.wan_vae",
    "converters.clip",
    "converters.t5",
    "converters.wan_transformer",
    "converters.cosmos_transformer",
    "converters.sana_transformer",
    "converters.qwen2_5_vl",
    "converters.gemma2",
    "converters.dcae",
    "converters.qwen3_vl",
)


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


_REGISTRY: dict[str, ModelSpec] = {}


class UnsupportedModelError(ValueError):
    """config.json names a class no converter handles (the message names the class)."""


def register(spec: ModelSpec) -> ModelSpec:
    _REGISTRY[spec.class_name] = spec
    return spec


def _load_providers() -> None:
    for name in _PROVIDERS:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # a provider that exists but fails to import is a real error
                raise


def class_name_of(config: dict) -> str:
    if "_class_name" in config:
        return config["_class_name"]
    archs = config.get("architectures") or []
    return archs[0] if archs else "<no _class_name or architectures in config.json>"


def spec_for(config: dict) -> ModelSpec:
    _load_providers()
    name = class_name_of(config)
    if name not in _REGISTRY:
        raise UnsupportedModelError(
            f"unsupported model class {name!r}; supported: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
