"""The XLA flags the suite compiles with, for the test session and the subprocesses it starts.

The suite compiles hundreds of small programs and runs each briefly. LLVM at -O1 instead of
XLA's default -O2 cut CPU time by 19% on the SD3 transformer and Wan VAE test files and by 7.5%
on the GRPO runs, with the same step times (docs/development.md, session 11)."""
from __future__ import annotations

import os

COMPILE_FLAGS = "--xla_backend_optimization_level=1"


def use_test_flags() -> None:
    """Add COMPILE_FLAGS to XLA_FLAGS unless the caller set that level: before any backend starts,
    so every worker and every subprocess that inherits the environment compiles with it."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {COMPILE_FLAGS}".strip()


def host_devices(n: int) -> str:
    """XLA_FLAGS for a subprocess with n virtual CPU devices, compiled as the suite compiles."""
    return f"--xla_force_host_platform_device_count={n} {COMPILE_FLAGS}"
