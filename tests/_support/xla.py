"""The XLA flags the suite compiles with, for the test session and the subprocesses it starts.

The suite compiles hundreds of small programs and runs each briefly, so it trades some code
quality for compile time, never the numbers:
- LLVM at -O1 instead of XLA's default -O2: -19% CPU on the SD3 transformer and Wan VAE test
  files, -7.5% on the GRPO runs, same step times (docs/development.md, session 11). Not -O0: it
  cut compiles further, but the VLM learning run then took twice as long, and six tight
  comparisons (against diffusers, numpy, one device) moved by 4e-7 to 2e-4 (session 22).
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
