"""programs.sample.generate keeps its compiled sample-and-decode per pipe and setting: a second
call with the same shapes (tiny_eval scores prompts in chunks) compiles nothing and gives the
same pixels; another setting gets its own program."""
from __future__ import annotations

import numpy as np
from jax._src import monitoring
from jax._src.dispatch import BACKEND_COMPILE_EVENT

from wfm_jax.families.base import load_pipeline
from wfm_jax.families.tiny import build_tiny_pipeline
from wfm_jax.programs.sample import generate


def _compiled_names(fn):
    names = []

    def on_compile(event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT:
            names.append(kwargs.get("fun_name", "?"))

    monitoring.register_event_duration_secs_listener(on_compile)
    try:
        return fn(), names
    finally:
        monitoring.unregister_event_duration_listener(on_compile)


def test_a_repeated_call_reuses_the_compiled_program(tmp_path):
    pipe = load_pipeline(build_tiny_pipeline(str(tmp_path / "pipe"), seed=0))
    kw = dict(steps=2, guidance=1.0, height=32, width=32, max_sequence_length=16)
    first, compiled = _compiled_names(lambda: generate(pipe, ["a red circle", "a blue square"], **kw))
    assert "jit(run)" in compiled
    again, compiled = _compiled_names(lambda: generate(pipe, ["a red circle", "a blue square"], **kw))
    assert "jit(run)" not in compiled, compiled
    np.testing.assert_array_equal(again, first)
    other, compiled = _compiled_names(lambda: generate(pipe, ["a red circle", "a blue square"],
                                                       **{**kw, "steps": 3}))
    assert "jit(run)" in compiled  # another schedule is another program
    assert other.shape == first.shape and not np.array_equal(other, first)
