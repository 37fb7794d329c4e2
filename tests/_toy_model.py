"""A tiny registered NNX model + mapping table + torch-layout checkpoint writer for loader tests.

It exercises every transform (identity, linear, conv), logical axes on every parameter, a
parameter with no logical names (replicated), and a non-parameter buffer that no rule loads.
"""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from converters import registry
from converters.table import Rule, conv, linear, norm
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.norms import LayerNorm

CLASS = "ToyNet2DModel"


class ToyNet(nnx.Module):
    def __init__(self, config, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        d, h = config["width"], config["hidden"]
        init = nnx.initializers.normal(0.02)
        self.conv = nnx.Dict(
            kernel=param(init(rngs.params(), (3, 3, 4, d), param_dtype),
                         (None, None, "conv_in", "conv_out")),
            bias=param(jnp.zeros((d,), param_dtype), ("conv_out",)))
        self.blocks = nnx.List([
            nnx.Dict(up=Linear(d, h, rngs=rngs, axes=("embed", "mlp"), dtype=dtype,
                               param_dtype=param_dtype),
                     down=Linear(h, d, rngs=rngs, axes=("mlp", "embed"), dtype=dtype,
                                 param_dtype=param_dtype))
            for _ in range(config["layers"])])
        self.norm = LayerNorm(d, param_dtype=param_dtype)
        self.gain = nnx.Param(jnp.ones((2,), param_dtype))  # no logical names: replicated
        self.freqs = nnx.Variable(jnp.arange(d // 2, dtype=jnp.float32))  # buffer, never loaded

    def __call__(self, x):
        x = x.astype(jnp.float32)
        for block in self.blocks:
            x = x + block.down(nnx.gelu(block.up(x)))
        return self.norm(x) * self.gain[...][0]


def build_table(config) -> list[Rule]:
    rules = conv("conv", "conv_in")
    for i in range(config["layers"]):
        rules += linear(f"blocks.{i}.up", f"blocks.{i}.ff.net.0")
        rules += linear(f"blocks.{i}.down", f"blocks.{i}.ff.net.2")
    rules += norm("norm", "norm_out")
    rules.append(Rule("gain", "gain"))
    return rules


def make_model(config, *, dtype=None, param_dtype=jnp.float32, rngs):
    return ToyNet(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


SPEC = registry.register(registry.ModelSpec(CLASS, build_table, make_model))

CONFIG = {"_class_name": CLASS, "width": 16, "hidden": 32, "layers": 2}


def torch_layout_tensors(config=CONFIG, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights in diffusers/torch layout (Linear (out, in), Conv OIHW)."""
    rng = np.random.default_rng(seed)
    d, h = config["width"], config["hidden"]
    shapes = {"conv_in.weight": (d, 4, 3, 3), "conv_in.bias": (d,),
              "norm_out.weight": (d,), "norm_out.bias": (d,), "gain": (2,)}
    for i in range(config["layers"]):
        shapes.update({f"blocks.{i}.ff.net.0.weight": (h, d), f"blocks.{i}.ff.net.0.bias": (h,),
                       f"blocks.{i}.ff.net.2.weight": (d, h), f"blocks.{i}.ff.net.2.bias": (d,)})
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def write_checkpoint(directory, tensors, config=CONFIG) -> str:
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "diffusion_pytorch_model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return str(directory)


BF16 = np.dtype(ml_dtypes.bfloat16)
