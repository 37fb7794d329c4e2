"""Peak FLOP/s per device kind, the environment the JSON records, and memory read-outs.

Peaks are dense bf16 tensor-core / MXU figures from the vendors' data sheets (sparsity excluded):
NVIDIA H100 and H200 data sheets (SXM: 989 TFLOP/s; H100 PCIe: 756; NVL: 835), NVIDIA A100
(312), Google Cloud TPU system-architecture pages (v4: 275, v5e: 197, v5p: 459, v6e: 918 per chip).
A CPU has no such figure here: the benchmark measures one (see `measured_cpu_peak`) and says so.
"""
from __future__ import annotations

import datetime
import os
import platform
import resource
import time

# (substring of the device kind, lower case, checked in order) -> dense bf16 TFLOP/s
PEAK_BF16_TFLOPS = (
    ("h100 pcie", 756.0),
    ("h100 nvl", 835.0),
    ("h200 nvl", 835.0),
    ("h100", 989.4),
    ("h200", 989.4),
    ("gh200", 989.4),
    ("a100", 312.0),
    ("tpu v4", 275.0),
    ("tpu v5 lite", 197.0),
    ("tpu v5e", 197.0),
    ("tpu v5p", 459.0),
    ("tpu v5", 459.0),
    ("tpu v6 lite", 918.0),
    ("tpu v6e", 918.0),
)


def peak_flops_for(device_kind: str) -> float | None:
    """Dense bf16 FLOP/s of one device of this kind, or None when the table lacks it."""
    kind = device_kind.lower()
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in kind:
            return tflops * 1e12
    return None


def measured_cpu_peak(size: int = 1024, repeats: int = 3) -> dict:
    """Best bf16 (size x size) @ (size x size) matmul rate of jax and torch on this CPU.

    Used as the MFU denominator on CPU: "fraction of what this CPU's best bf16 GEMM reaches",
    not a hardware peak.
    """
    import jax
    import jax.numpy as jnp
    import torch

    flops = 2.0 * size ** 3
    a = jnp.ones((size, size), jnp.bfloat16)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    best_jax = min(_timed(lambda: mm(a).block_until_ready()) for _ in range(repeats))
    t = torch.ones(size, size, dtype=torch.bfloat16)
    t @ t
    best_torch = min(_timed(lambda: t @ t) for _ in range(repeats))
    rates = {"jax": flops / best_jax, "torch": flops / best_torch}
    return {"peak_flops": max(rates.values()), "matmul_flops": rates,
            "peak_source": f"measured on this CPU: best bf16 {size}^3 matmul of jax "
                           f"({rates['jax'] / 1e9:.1f} GFLOP/s) and torch "
                           f"({rates['torch'] / 1e9:.1f} GFLOP/s); not a hardware peak"}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def device_info() -> dict:
    """Device kind and count as jax and torch see them (torch only reports CUDA here)."""
    import jax
    import torch

    dev = jax.local_devices()[0]
    info = {"platform": dev.platform, "device_kind": dev.device_kind,
            "jax_devices": jax.local_device_count(), "torch_device": "cpu"}
    if torch.cuda.is_available():
        info["torch_device"] = "cuda"
        info["torch_device_name"] = torch.cuda.get_device_name(0)
    if dev.platform == "cpu":
        info["cpu"] = platform.processor() or platform.machine()
        info["cpu_count"] = os.cpu_count()
    return info


def peak_info(device_kind: str, platform_name: str, cpu_peak_size: int = 1024) -> dict:
    if platform_name == "cpu":
        return measured_cpu_peak(cpu_peak_size)
    peak = peak_flops_for(device_kind)
    if peak is None:
        return {"peak_flops": None,
                "peak_source": f"no dense bf16 peak known for {device_kind!r}: MFU n/a"}
    return {"peak_flops": peak, "peak_source": f"data-sheet dense bf16 peak for {device_kind!r}"}


def environment() -> dict:
    import diffusers
    import flax
    import jax
    import peft
    import torch

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "jax": jax.__version__, "flax": flax.__version__,
            "torch": torch.__version__, "diffusers": diffusers.__version__,
            "peft": peft.__version__, "host": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ENV_KEYS if k in os.environ},
            "load_average_1m": os.getloadavg()[0]}


# Settings that change the figures; recorded when set.
ENV_KEYS = ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES")


# ----------------------------------------------------------------------------- memory

def jax_peak_memory() -> tuple[int | None, str]:
    """(bytes, source): the device allocator's peak, where the backend reports one."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return (int(stats["peak_bytes_in_use"]),
                "jax memory_stats peak_bytes_in_use (process lifetime)")
    return None, "n/a: this jax backend reports no memory_stats (CPU)"


def torch_reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def torch_peak_memory(device) -> tuple[int | None, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    return None, "n/a: torch keeps no allocator statistics on CPU"


def process_peak_rss() -> int:
    """Peak resident set size of this process in bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
