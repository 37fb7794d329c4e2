"""The XLA flags the suite compiles with, for the test session and the subprocesses it starts.

The suite compiles hundreds of small programs and runs each briefly, so it trades a little code
quality for compile time, never the numbers:
- LLVM at -O1 instead of XLA's default -O2: -19% CPU on the SD3 transformer and Wan VAE test
  files, -7.5% on the GRPO runs, same step times (docs/development.md, session 11). Not -O0: it
  cut compiles further but ran the VLM learning run 3x slower and moved six tight comparisons
  (against diffusers, numpy, one device) by 4e-7 to 2e-4 (session 22).
- XLA:CPU's older elemental emitters instead of its MLIR fusion emitters: XLA compile seconds -21%
  on four heavy files and -54% with -O0 over the whole suite, the same step times, and every
  comparison of the suite still within its tolerance (session 22).
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
