"""Device-synchronised timing and the per-stack figure record every workload returns."""
from __future__ import annotations

import math
import numbers
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Figures every stack record carries (a number, or None with a note saying why).
FIGURES = ("step_time_s", "samples_per_s", "flops_per_step", "tflops_per_s", "mfu",
           "peak_memory_bytes", "compile_time_s")


def progress(message: str) -> None:
    """One stderr line per phase of a run (weights built, compiled, timed): a run killed at its
    time limit still says how far it got and how long each phase took."""
    print(f"bench [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


PROFILE_STEPS = 3


def profile_calls(call: Callable[[], Any], sync: Callable[[Any], None], directory: str | None,
                  name: str) -> str | None:
    """A jax.profiler trace (TensorBoard / Perfetto) of PROFILE_STEPS calls, after the timed
    ones so it costs the figures nothing; where the time of a step goes, kernel by kernel."""
    if not directory:
        return None
    import os

    import jax
    path = os.path.join(directory, name)
    with jax.profiler.trace(path):
        for _ in range(PROFILE_STEPS):
            sync(call())
    return path


def time_calls(call: Callable[[], Any], sync: Callable[[Any], None], *, warmup: int,
               repeats: int) -> dict:
    """First call (timed alone: it compiles / warms caches), `warmup` untimed calls, then
    `repeats` timed calls, each ended by `sync` (block_until_ready / cuda.synchronize)."""
    start = time.perf_counter()
    sync(call())
    first = time.perf_counter() - start
    for _ in range(warmup):
        sync(call())
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        sync(call())
        times.append(time.perf_counter() - start)
    return {"first_call_s": first, "step_times_s": times, "step_time_s": statistics.median(times)}


def time_back_to_back(call: Callable[[], Any], sync: Callable[[Any], None], *,
                      repeats: int) -> float:
    """Seconds per call of `repeats` calls dispatched one after another with one `sync` at the
    end: the step time of a loop that queues step N + 1 while step N runs, so the host's
    dispatch (argument flattening, launch set-up) hides behind the device's work. Against
    time_calls' step (each call waited for), the difference is host time the device sat idle."""
    start = time.perf_counter()
    out = None
    for _ in range(max(1, repeats)):
        out = call()
    sync(out)
    return (time.perf_counter() - start) / max(1, repeats)


def record(stack: str, impl: str, timing: dict, *, samples: int, flops: float | None,
           peak_flops: float | None, memory: tuple[int | None, str],
           compile_time_s: float | None, compile_note: str, extra: dict | None = None,
           notes: dict | None = None) -> dict:
    """One stack's figures for one workload; every None figure gets a note naming the reason."""
    step = timing["step_time_s"]
    notes = dict(notes or {})
    out = {"stack": stack, "impl": impl, "status": "ok",
           "step_time_s": step, "step_times_s": timing["step_times_s"],
           "first_call_s": timing["first_call_s"],
           "samples_per_step": samples, "samples_per_s": samples / step,
           "flops_per_step": flops,
           "tflops_per_s": None if flops is None else flops / step / 1e12,
           "mfu": None if flops is None or not peak_flops else flops / step / peak_flops,
           "peak_memory_bytes": memory[0], "compile_time_s": compile_time_s}
    notes["peak_memory_bytes"] = memory[1]
    notes["compile_time_s"] = compile_note
    if flops is None:
        notes.setdefault("flops_per_step", "no FLOP count for this workload")
        notes.setdefault("tflops_per_s", notes["flops_per_step"])
    if out["mfu"] is None:
        notes.setdefault("mfu", notes.get("flops_per_step") or "no peak FLOP/s for this device")
    out["notes"] = notes
    out.update(extra or {})
    return out


def failed(stack: str, impl: str, error: BaseException) -> dict:
    """A stack that could not run this workload (e.g. out of memory): recorded, not fatal."""
    message = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    return {"stack": stack, "impl": impl, "status": "error", "error": message,
            **dict.fromkeys(FIGURES), "notes": dict.fromkeys(FIGURES, message)}


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def gib(n) -> str:
    """Bytes as GiB with two decimals, as every bench table and progress line writes them; "n/a"
    where none were measured. Any real number (numpy's integers too, which `finite` refuses)."""
    real = isinstance(n, numbers.Real) and not isinstance(n, bool)
    return f"{float(n) / 2 ** 30:.2f}" if real and math.isfinite(n) else "n/a"
