"""abstract_module builds the same abstract module as nnx.eval_shape and leaves jax's tracer
error text as it found it."""
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
