"""abstract_module(make): nnx.eval_shape(make) without the quadratic cost jax adds to building a
large model abstractly.

flax's Variable.set_value probes getattr(value, "sharding", None) at every RNG draw; on a tracer
jax builds that AttributeError's text by walking the whole trace for the value's origin
(find_progenitors), so each draw costs the size of everything traced so far (the Cosmos-14B
transformer: 72 s of abstract setup, 30 s without). getattr's default drops the text unread, so
the walk is skipped while `make` runs."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

M = TypeVar("M")


@contextlib.contextmanager
def quiet_tracer_origins() -> Iterator[None]:
    from jax._src.interpreters import partial_eval

    tracer = partial_eval.DynamicJaxprTracer
    original = tracer.__dict__.get("_origin_msg")
    if original is None:  # another jax: nothing to skip
        yield
        return
    tracer._origin_msg = lambda self: ""  # type: ignore[method-assign]
    try:
        yield
    finally:
        tracer._origin_msg = original  # type: ignore[method-assign]


def abstract_module(make: Callable[[], M]) -> M:
    """nnx.eval_shape(make): the module `make` builds, its arrays ShapeDtypeStructs."""
    from flax import nnx

    with quiet_tracer_origins():
        return nnx.eval_shape(make)
