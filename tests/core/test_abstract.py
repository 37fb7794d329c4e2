"""abstract_module builds the same abstract module as nnx.eval_shape and leaves jax's tracer
error text as it found it; the library builds its abstract models through it only."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from wfm_jax.core.abstract import abstract_module


class _Two(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.a = nnx.Linear(3, 4, rngs=rngs)
        self.b = nnx.Linear(4, 5, rngs=rngs)


def _shapes(model) -> dict:
    return {str(p): (v.shape, v.dtype) for p, v in nnx.state(model).flat_state()}


def test_same_shapes_as_eval_shape_and_the_origin_text_comes_back():
    quiet = abstract_module(lambda: _Two(nnx.Rngs(0)))
    plain = nnx.eval_shape(lambda: _Two(nnx.Rngs(0)))
    assert _shapes(quiet) == _shapes(plain) and len(_shapes(quiet)) == 4  # two kernels, two biases
    assert all(isinstance(v.get_value(), jax.ShapeDtypeStruct)
               for _, v in nnx.state(quiet).flat_state())  # no array allocated

    def concretize(x):
        return float(jnp.sin(x))  # a tracer asked for its value: jax says where it came from

    with pytest.raises(jax.errors.ConcretizationTypeError, match="depends on the value"):
        jax.jit(concretize)(1.0)


def test_the_library_builds_abstract_models_only_through_abstract_module():
    """A direct nnx.eval_shape of a model pays the quadratic origin walk again (session 52 found
    nine such calls; the 8B Qwen3-VL count took 7.2 s against 1.5 s): every call in the library
    goes through abstract_module."""
    import ast
    import pathlib

    from tests._support.paths import REPO_ROOT

    def direct_calls(path: pathlib.Path) -> list[int]:
        return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "eval_shape" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "nnx"]

    own = pathlib.Path(REPO_ROOT, "wfm_jax", "core", "abstract.py")
    found = [f"{path.relative_to(REPO_ROOT)}:{n}"
             for package in ("wfm_jax", "converters", "reward_client")
             for path in sorted(pathlib.Path(REPO_ROOT, package).rglob("*.py")) if path != own
             for n in direct_calls(path)]
    assert found == []
