"""The XLA flags the suite compiles with, for the test session and the subprocesses it starts.

The suite compiles hundreds of small programs and runs each briefly, so it trades some code
quality for compile time, never the numbers:
- LLVM at -O1 instead of XLA's default -O2: -19% CPU on the SD3 transformer and Wan VAE test
  files, -7.5% on the GRPO runs, same step times (docs/development.md, session 11). Not -O0 for
  the whole session: it cut compiles further, but the VLM learning run then took twice as long,
  and six tight comparisons (against diffusers, numpy, one device) moved by 4e-7 to 2e-4
  (session 22). The files and tests marked `compile_bound` do compile at -O0 (below).
- XLA:CPU's older elemental emitters instead of its MLIR fusion emitters: the suite's XLA compile
  seconds 2077 -> 1537 and its wall time 33 -> 27 minutes, with every comparison still within
  its tolerance (session 22). The trainer keeps XLA's defaults: on the quick start, which is held
  by execution, not compiles, the emitters were slower (293 s against 258 s).
A flag the caller already set is left as the caller set it."""
from __future__ import annotations

import os

COMPILE_FLAGS = ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false")


def use_test_flags() -> None:
    """Add each of COMPILE_FLAGS to XLA_FLAGS unless the caller set that flag: before any backend
    starts, so every worker and every subprocess that inherits the environment compiles with it."""
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in COMPILE_FLAGS if f.split("=")[0] not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()


def host_devices(n: int) -> str:
    """XLA_FLAGS for a subprocess with n virtual CPU devices, compiled as the suite compiles."""
    return " ".join([f"--xla_force_host_platform_device_count={n}", *COMPILE_FLAGS])


# Files and tests whose time is compiling, not running (a `compile_bound` mark): their CPU
# programs compile at LLVM -O0. In session 31's pairs that cut the compiles of train steps and RL
# updates by a third to a half and left most forward-only programs as they were, and -O0 code
# runs slower, so the marks follow measured pairs; the learning runs and the tight comparisons
# that moved at -O0 stay unmarked. TPU compiles (libtpu, the planner's tests) are never touched:
# what they report must be what a user's plan reports.
#
# The level is a jax config state in jax's jit and trace cache keys, not a bare global: an
# executable compiled at -O0 in a marked test must never be reused by an unmarked one. With a
# global it was (session 31): the SFT VAE encoder compiled at -O0 in test_sft_train, reused in
# test_sft_encode next to a fresh -O1 one, and two bit-for-bit comparisons there failed on CI.
_STATE_NAME = "wfm_test_cpu_o0"
o0_compiles = 0  # CPU compiles the switch has set to -O0 (tests/_support/test_xla.py reads it)


def _cpu_o0_state():
    """The config state, registered once per process (jax refuses a second registration)."""
    from jax._src import config

    state = config.config_states.get(_STATE_NAME)
    if state is None:
        state = config.bool_state(
            _STATE_NAME, False, "wfm_jax tests: compile CPU programs at LLVM -O0",
            include_in_jit_key=True, include_in_trace_context=True)
    return state


def compile_cpu_at_o0(on: bool) -> None:
    """From now on, compile CPU programs at LLVM -O0 (on) or at the session's level (off). A
    program jitted under one level is compiled again, not reused, under the other."""
    import jax

    _cpu_o0_state()
    jax.config.update(_STATE_NAME, on)


def install_compile_level_switch() -> None:
    """Wrap jax's compile-options builder so that compile_cpu_at_o0 reaches every CPU compile."""
    from jax._src import compiler

    state = _cpu_o0_state()
    build = compiler.get_compile_options
    if getattr(build, "_wfm_switch", False):
        return

    def get_compile_options(*args, **kwargs):
        options = build(*args, **kwargs)
        backend = kwargs.get("backend")
        if state.value and backend is not None and backend.platform == "cpu":
            global o0_compiles
            options.executable_build_options.debug_options.xla_backend_optimization_level = 0
            o0_compiles += 1
        return options

    get_compile_options._wfm_switch = True  # type: ignore[attr-defined]
    compiler.get_compile_options = get_compile_options
