"""LoRA adapters addressed by diffusers module names, and their peft/diffusers state dict.

Target names match the way peft matches `LoraConfig.target_modules` given as a list: a layer whose
dotted path equals a target or ends with "." + target ("attn.to_q" hits
"transformer_blocks.3.attn.to_q", not "transformer_blocks.3.attn2.to_q"). wfm_jax keeps
diffusers' module names, so the same list addresses the same layers in both frameworks.

Export keys are what `StableDiffusion3Pipeline.load_lora_weights` and
`WanPipeline.load_lora_weights` read (both adapt the module named by the prefix, "transformer"):
"transformer.<path>.lora_A.weight" (r, in) and "transformer.<path>.lora_B.weight" (out, r), with
the peft `LoraConfig` (r, lora_alpha, target_modules, ...) in the safetensors header under
"lora_adapter_metadata" (keys prefixed "transformer."), so the scale alpha / r survives.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.errors import UserError
from wfm_jax.core.tree import path_str
from wfm_jax.models.layers.linear import Linear

INITS = ("gaussian", "default")


class LoraError(UserError, ValueError):
    """A LoRA request that cannot be honoured (unknown target, bad rank, unknown init)."""


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def find_targets(model: nnx.Module, target_modules: Sequence[str]) -> dict[str, Linear]:
    """dotted path -> Linear for every Linear matching a target; a target that matches nothing is
    an error naming it (peft would silently skip it in some versions)."""
    targets = [t.strip() for t in target_modules if t and t.strip()]
    if not targets:
        raise LoraError("policy.lora.target_modules is empty")
    layers = {path_str(p): m for p, m in nnx.iter_modules(model) if isinstance(m, Linear)}
    found = {p: m for p, m in layers.items() if any(_matches(p, t) for t in targets)}
    unmatched = [t for t in targets if not any(_matches(p, t) for p in layers)]
    if unmatched:
        examples = sorted({".".join(p.split(".")[-2:]) for p in layers})[:12]
        raise LoraError(f"LoRA target_modules {unmatched} match no linear layer of the model "
                        f"(layer names end like: {', '.join(examples)})")
    return found


def attach_lora(model: nnx.Module, target_modules: Sequence[str], r: int, lora_alpha: float,
                *, seed: int = 0, init: str = "gaussian") -> list[str]:
    """Add LoRA (scale lora_alpha / r) to every target layer in place; returns their paths.

    init "gaussian": A ~ N(0, 1/r) (peft's std = 1/r), B = 0; "default": A kaiming-uniform
    (a = sqrt(5), bound 1/sqrt(in)), B = 0, as peft's default. Each layer's A draws from
    fold_in(key(seed), index in sorted path order), so every process builds the same adapter.
    """
    if init not in INITS:
        raise LoraError(f"policy.lora.init_lora_weights={init!r} is not supported; use one of "
                        f"{list(INITS)} (B starts at zero, so A must be random)")
    if int(r) < 1:
        raise LoraError(f"policy.lora.r must be >= 1, got {r}")
    layers = find_targets(model, target_modules)
    base = jax.random.key(seed)
    for i, path in enumerate(sorted(layers)):
        layer = layers[path]
        key = jax.random.fold_in(base, i)
        layer.add_lora(int(r), float(lora_alpha), nnx.Rngs(params=key))
        if init == "default":
            bound = 1.0 / math.sqrt(layer.in_features)
            a = jax.random.uniform(key, (layer.in_features, int(r)), jnp.float32, -bound, bound)
            assert layer.lora_a is not None  # add_lora made it
            layer.lora_a[...] = a
    return sorted(layers)


def lora_paths(model: nnx.Module) -> list[str]:
    """Paths of the layers that carry LoRA."""
    return sorted(path_str(p) for p, m in nnx.iter_modules(model)
                  if isinstance(m, Linear) and m.lora_a is not None)


def adapter_config(r: int, lora_alpha: float, target_modules: Sequence[str],
                   init: str = "gaussian") -> dict:
    """The peft LoraConfig kwargs diffusers rebuilds the adapter from."""
    return {"r": int(r), "lora_alpha": float(lora_alpha), "target_modules": sorted(target_modules),
            "init_lora_weights": init, "lora_dropout": 0.0, "bias": "none",
            "use_dora": False, "use_rslora": False, "peft_type": "LORA"}


def to_diffusers(lora_flat: Mapping[str, np.ndarray], prefix: str = "transformer"
                 ) -> dict[str, np.ndarray]:
    """{"<layer>.lora_a": (in, r), "<layer>.lora_b": (r, out)} -> peft/diffusers keys
    "<prefix>.<layer>.lora_A.weight" (r, in) and "...lora_B.weight" (out, r)."""
    out = {}
    for key, value in lora_flat.items():
        layer, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise LoraError(f"not a LoRA parameter path: {key}")
        name = "lora_A" if leaf == "lora_a" else "lora_B"
        out[f"{prefix}.{layer}.{name}.weight"] = np.ascontiguousarray(np.asarray(value).T)
    return out


def from_diffusers(state_dict: Mapping[str, np.ndarray], prefix: str = "transformer"
                   ) -> dict[str, np.ndarray]:
    """The inverse of `to_diffusers` (for tests and for loading an exported adapter)."""
    out = {}
    for key, value in state_dict.items():
        if not key.startswith(prefix + ".") or not key.endswith(".weight"):
            raise LoraError(f"unexpected LoRA key {key}")
        layer, _, name = key[len(prefix) + 1:-len(".weight")].rpartition(".")
        leaf = {"lora_A": "lora_a", "lora_B": "lora_b"}.get(name)
        if leaf is None:
            raise LoraError(f"unexpected LoRA key {key}")
        out[f"{layer}.{leaf}"] = np.ascontiguousarray(np.asarray(value).T)
    return out
