"""Run the workloads of a suite on both stacks and collect one result dict (what the JSON holds).

In-process (the cpu/tiny default): every torch run first, then every wfm_jax run, in this
process; on a GPU jax then allocates on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false, set by
__main__) after torch has emptied its cache. Isolated (the gpu default): each (workload, stack)
runs in its own `python -m wfm_jax.bench --worker` process, so each peak-memory figure belongs to
that run alone (jax's peak_bytes_in_use cannot be reset) and no allocator pool outlives its run;
this parent process then never touches the device.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile

from wfm_jax.bench import report
from wfm_jax.bench.suites import Options, Suite
from wfm_jax.bench.timing import gib

WORKLOADS = {
    "train_full": "full fine-tune train step: flow-matching loss, AdamW, bf16 compute",
    "train_lora": "LoRA train step (attention projections): flow-matching loss, AdamW, bf16",
    "rollout": "DPM-Solver++(2M) rollout, no CFG, plus VAE decode to pixels, bf16",
    "reward": "reward reference-server round trip (encode, enqueue, pull) of a uint8 batch",
}
STACKS = ("torch", "wfm_jax")


class BenchError(ValueError):
    """Bad benchmark request (unknown workload, unwritable output...)."""


def run_one(workload: str, stack: str, suite: Suite, options: Options, peak: dict) -> dict:
    """One workload on one stack, in this process; an exception becomes an error record."""
    from wfm_jax.bench import timing
    peak_flops = peak.get("peak_flops")
    try:
        if workload == "reward":
            from wfm_jax.bench import reward_rt
            return reward_rt.run(suite, stack)
        if stack == "torch":
            from wfm_jax.bench import torch_side
            if workload == "rollout":
                return torch_side.rollout(suite, options, peak_flops)
            return torch_side.train(suite, workload.split("_")[1], options, peak_flops)
        if workload == "rollout":
            from wfm_jax.bench import rollout
            return rollout.run(suite, options, peak_flops)
        from wfm_jax.bench import jax_side
        return jax_side.train(suite, workload.split("_")[1], options, peak_flops)
    except Exception as e:  # recorded in the JSON: one failing stack must not lose the others
        return timing.failed(stack, workload, e)
    finally:
        _release(stack)


def _release(stack: str) -> None:
    gc.collect()
    if stack == "torch" and "torch" in sys.modules:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def context() -> dict:
    """Environment, device and peak FLOP/s of this process (the JSON's meta block)."""
    from wfm_jax.bench import devices
    info = devices.device_info()
    return {"environment": devices.environment(), "device": info,
            "peak": devices.peak_info(info["device_kind"], info["platform"])}


def run_suite(suite: Suite, *, only=None, options: Options = Options(), isolate: bool = False,
              stacks=STACKS, command: str | None = None) -> dict:
    unknown = [n for n in only or () if n not in WORKLOADS]
    if unknown:
        raise BenchError(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    names = [n for n in WORKLOADS if only is None or n in only]  # table order stays fixed
    ctx = _worker(suite, options, "context", None, {}) if isolate else context()
    records = {n: {} for n in names}
    for stack in STACKS:  # torch first: see the module docstring
        if stack not in stacks:
            continue
        for name in names:
            if isolate:
                records[name][stack] = _worker(suite, options, name, stack, ctx["peak"])
            else:
                records[name][stack] = run_one(name, stack, suite, options, ctx["peak"])
            _announce(name, stack, records[name][stack])
    return report.assemble(suite, options, isolate, ctx, records, WORKLOADS, command)


def _announce(name: str, stack: str, rec: dict) -> None:
    """Each record as soon as it exists: a suite stopped at a time limit keeps what it measured."""
    from wfm_jax.bench import timing
    if rec["status"] != "ok":
        timing.progress(f"{name}/{stack}: {rec['error']}")
        return
    mem = rec.get("peak_memory_bytes")
    timing.progress(f"{name}/{stack}: step {rec['step_time_s'] * 1e3:.1f} ms, "
                    f"MFU {rec['mfu'] if rec['mfu'] is None else round(rec['mfu'], 4)}, "
                    f"peak {gib(mem)} GiB, "
                    f"compile {rec['compile_time_s']} s; record {json.dumps(rec)}")


def _worker(suite: Suite, options: Options, workload: str, stack: str | None, peak: dict):
    """Run one (workload, stack) -- or "context" -- in a fresh python process."""
    from wfm_jax.bench import timing
    env = dict(os.environ)
    if stack == "torch":
        env["JAX_PLATFORMS"] = "cpu"  # jax must not claim GPU memory in a torch run
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "record.json")
        spec = {"suite": dataclasses.asdict(suite), "options": dataclasses.asdict(options),
                "workload": workload, "stack": stack, "peak": peak, "out": out}
        cmd = [sys.executable, "-m", "wfm_jax.bench", "--worker", json.dumps(spec)]
        # the worker's stderr is passed on line by line as it comes (its progress lines must
        # reach the log even if the suite is killed mid-run); the last other line is the error
        last = "no output"
        with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as proc:
            for line in proc.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                if line.strip() and not line.startswith("bench ["):
                    last = line.strip()
        if proc.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                return json.load(f)
        error = RuntimeError(f"worker exited {proc.returncode}: {last}")
    if workload == "context":
        raise BenchError(f"could not read the device context: {error}")
    return timing.failed(stack, workload, error)


def worker_main(spec_json: str) -> int:
    """Entry of `--worker`: run what the spec names and write its JSON record."""
    from wfm_jax.bench import devices
    spec = json.loads(spec_json)
    s = dict(spec["suite"])
    s["reward_shape"] = tuple(s["reward_shape"])
    suite = Suite(**s)
    options = Options(**spec["options"])
    if spec["workload"] == "context":
        result = context()
    else:
        result = run_one(spec["workload"], spec["stack"], suite, options, spec["peak"])
        if (spec["workload"] != "reward" and result["status"] == "ok"
                and result["peak_memory_bytes"] is None):
            result["peak_memory_bytes"] = devices.process_peak_rss()
            result["notes"]["peak_memory_bytes"] = (
                "peak RSS of the isolated worker process (CPU: no device allocator; includes "
                "imports and the random weights on the host)")
    report.write_json_atomic(result, spec["out"])
    return 0
