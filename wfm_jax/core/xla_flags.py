"""XLA flags for overlapping FSDP communication with compute on NVIDIA GPUs.

The latency-hiding scheduler and async collectives let XLA issue the next block's all-gather
(and the previous block's reduce-scatter) while the current block computes, instead of leaving
the collectives exposed; combine thresholds batch small collectives into large ones; pipelined
collectives and while-loop double buffering do the same across iterations of the scanned block
stacks. These are the settings MaxText / MaxDiffusion run with. Only `xla_gpu_*` flags: other
platforms ignore them.

Applied by the entry points (train, generate, bench) before jax starts its backend. A flag
already in XLA_FLAGS is left as the user set it; WFM_JAX_XLA_DEFAULTS=0 adds none of them.
The same call keeps jax off the TPU plugin on a host with no TPU (skip_absent_tpu).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping

GPU_DEFAULTS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_highest_priority_async_stream=true",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
    "--xla_gpu_all_reduce_combine_threshold_bytes=134217728",
)


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


def with_defaults(xla_flags: str) -> str:
    """`xla_flags` plus each default whose flag name it does not already set."""
    present = {_name(f) for f in xla_flags.split()}
    added = [f for f in GPU_DEFAULTS if _name(f) not in present]
    return " ".join([xla_flags.strip()] + added).strip()


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set XLA_FLAGS in `environ` to with_defaults(...) unless WFM_JAX_XLA_DEFAULTS=0; then
    skip_absent_tpu."""
    if environ.get("WFM_JAX_XLA_DEFAULTS", "1") != "0":
        environ["XLA_FLAGS"] = with_defaults(environ.get("XLA_FLAGS", ""))
    skip_absent_tpu(environ)


def skip_absent_tpu(environ: MutableMapping[str, str] = os.environ) -> bool:
    """libtpu installed (the tpu extra compiles TPU programs anywhere) on a host with neither a
    TPU chip nor an NVIDIA GPU: jax would still start the TPU plugin, and libtpu prints a screen
    of warnings before falling back to the CPU, burying a run's one-line errors. Name the CPU
    instead. A JAX_PLATFORMS the user set is kept; returns whether this set it."""
    if environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return False
    from jax._src import hardware_utils  # the PCI scan jax's own TPU init uses
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] or \
            hardware_utils.has_visible_nvidia_gpu():
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    if environ is os.environ and "jax" in sys.modules:  # jax read the variable on import
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    return True


def virtual_devices(n: int) -> None:
    """N simulated CPU devices; must run before jax starts its backend. Set in the environment
    as well, so worker processes started after it (the bench's isolated workers) get them too."""
    flag = f"--xla_force_host_platform_device_count={n}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_platforms", "cpu")
