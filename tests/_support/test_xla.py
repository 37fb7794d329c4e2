"""The `compile_bound` switch reaches jax's compiles: a marked test's CPU programs are built with
LLVM -O0, an unmarked test's with the session's level. If jax stopped passing its backend to the
wrapped options builder, the marks would silently do nothing; this fails instead. And a program
compiled at one level is never reused at the other (session 31's CI failure)."""
import jax
import jax.numpy as jnp
import pytest

from tests._support import xla
from tests._support.compiles import CompileCounter


def _compile_a_new_program() -> int:
    before = xla.o0_compiles
    jax.jit(lambda x: x * 3.0 + 1.0).lower(jax.ShapeDtypeStruct((3,), jnp.float32)).compile()
    return xla.o0_compiles - before


@pytest.mark.compile_bound
def test_a_marked_test_compiles_at_o0():
    assert _compile_a_new_program() == 1


def test_an_unmarked_test_compiles_at_the_session_level():
    assert _compile_a_new_program() == 0


def test_the_options_builder_sets_level_zero_for_the_cpu_only():
    from jax._src import compiler

    cpu = jax.devices("cpu")[0].client
    xla.compile_cpu_at_o0(True)
    try:
        on = compiler.get_compile_options(1, 1, backend=cpu)
        off_backend = compiler.get_compile_options(1, 1)
    finally:
        xla.compile_cpu_at_o0(False)
    off = compiler.get_compile_options(1, 1, backend=cpu)
    level = lambda o: o.executable_build_options.debug_options.xla_backend_optimization_level
    assert level(on) == 0 and level(off) == level(off_backend) == 1  # the suite's -O1


def test_a_program_compiled_at_one_level_is_compiled_again_at_the_other():
    """An unmarked test must not run an executable a marked test compiled at -O0 (nor the other
    way round): the level is in jax's cache keys, so each level compiles its own and keeps it."""
    scale = jax.jit(lambda x: x * 3.0 + 1.0)
    x = jnp.arange(3.0)
    with CompileCounter() as counter:
        counter.counting = True
        scale(x)  # the session's -O1
        o0_before = xla.o0_compiles
        xla.compile_cpu_at_o0(True)
        try:
            scale(x)  # compiled again, at -O0
            scale(x)  # and that one reused
        finally:
            xla.compile_cpu_at_o0(False)
        scale(x)  # the -O1 executable again, not the -O0 one
    assert xla.o0_compiles - o0_before == 1
    assert len(counter.names) == 2, counter.names
