"""programs.sample.generate keeps its compiled sample-and-decode per pipe and setting: a second
call with the same shapes (tiny_eval scores prompts in chunks) compiles nothing and gives the
same pixels; another setting gets its own program."""
from __future__ import annotations

import numpy as np

from tests._support.compiles import CompileCounter
from wfm_jax.families.base import load_pipeline
from wfm_jax.families.tiny import build_tiny_pipeline
from wfm_jax.programs.sample import generate


def _compiled_names(fn):
    with CompileCounter() as counter:
        counter.counting = True
        return fn(), counter.names


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
