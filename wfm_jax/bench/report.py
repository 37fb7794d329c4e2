"""The result document (JSON), the wfm_jax / torch ratios and the markdown table."""
from __future__ import annotations

import dataclasses
import json
import os

from wfm_jax.bench.timing import FIGURES, finite, gib
from wfm_jax.io.atomic import write_text_atomic

SCHEMA_VERSION = 1


def ratios(jax_rec: dict | None, torch_rec: dict | None) -> dict:
    """wfm_jax / torch for every figure (None where either side has no number), plus
    `speedup` = torch step time / wfm_jax step time (> 1: wfm_jax is faster)."""
    out = {}
    for key in FIGURES:
        a = (jax_rec or {}).get(key)
        b = (torch_rec or {}).get(key)
        out[key] = a / b if finite(a) and finite(b) and b != 0 else None
    step = out["step_time_s"]
    out["speedup"] = 1.0 / step if step else None
    return out


# A busy machine skews the two stacks unequally (a run under load once reported wfm_jax 8-16x
# faster because torch's matmul rate collapsed): past these limits the ratios are withheld.
BUSY_LOAD_PER_CORE = 0.5   # 1-minute load average at start, per core
BUSY_MATMUL_SPREAD = 2.0   # the same bf16 matmul, jax vs torch: fastest / slowest


def busy_reasons(ctx: dict) -> list[str]:
    """Why this machine looked busy while the suite ran (empty: it looked idle)."""
    reasons = []
    dev, env = ctx.get("device", {}), ctx.get("environment", {})
    load, cores = env.get("load_average_1m"), dev.get("cpu_count")
    if dev.get("platform") == "cpu" and finite(load) and cores and load > BUSY_LOAD_PER_CORE * cores:
        reasons.append(f"load average {load:.1f} on {cores} cores at start")
    rates = (ctx.get("peak") or {}).get("matmul_flops") or {}
    if len(rates) == 2 and all(finite(r) and r > 0 for r in rates.values()):
        slow, fast = min(rates, key=rates.get), max(rates, key=rates.get)
        spread = rates[fast] / rates[slow]
        if spread > BUSY_MATMUL_SPREAD:
            reasons.append(f"the same bf16 matmul ran {spread:.1f}x slower in {slow} than in "
                           f"{fast}")
    return reasons


def workload_flops(suite, name: str) -> dict | None:
    wl = suite.workload
    fwd = wl.forward_flops(suite)
    if name.startswith("train"):
        return {**wl.train_flops(suite, name == "train_lora"), "forward_per_sample": fwd}
    if name == "rollout":
        return {**wl.rollout_flops(suite), "forward_per_sample": fwd}
    return None


def assemble(suite, options, isolate: bool, ctx: dict, records: dict, descriptions: dict,
             command: str | None = None) -> dict:
    busy = busy_reasons(ctx)
    workloads = {}
    for name, stacks in records.items():
        r = ratios(stacks.get("wfm_jax"), stacks.get("torch"))
        workloads[name] = {"description": descriptions[name], "flops": workload_flops(suite, name),
                           "stacks": stacks,
                           "ratio_wfm_jax_over_torch": dict.fromkeys(r) if busy else r}
    return {"schema_version": SCHEMA_VERSION, "suite": suite.name, "shapes": suite.shapes(),
            "warmup": suite.warmup, "repeats": suite.repeats,
            "options": dataclasses.asdict(options), "isolated_processes": isolate,
            "command": command, **ctx, "busy": busy, "workloads": workloads}


def busy_warning(result: dict) -> str | None:
    busy = result.get("busy")
    return (f"machine busy ({'; '.join(busy)}): wfm_jax / torch ratios withheld, the figures "
            f"are not comparable; rerun on an idle machine") if busy else None


# ----------------------------------------------------------------------------- markdown

def _num(x, fmt: str, scale: float = 1.0) -> str:
    return format(x * scale, fmt) if finite(x) else "n/a"


def _ratio(x) -> str:
    return f"{x:.2f}x" if finite(x) else "n/a"


COLUMNS = ("workload", "stack", "step time (ms)", "samples/s", "TFLOP/step", "TFLOP/s", "MFU",
           "peak mem (GiB)", "compile (s)")


def markdown(result: dict) -> str:
    env, dev, peak = result["environment"], result["device"], result["peak"]
    kind = dev.get("torch_device_name") or dev["device_kind"]
    if dev["platform"] == "cpu":  # shared CPUs: the load says how much of them the run had
        kind = (f"{dev.get('cpu_count')} CPU cores, load average {env['load_average_1m']:.1f} "
                "at start")
    lines = [f"Suite `{result['suite']}` on {kind} ({dev['platform']}), {env['date']}; "
             f"jax {env['jax']}, torch {env['torch']}, diffusers {env['diffusers']}, "
             f"peft {env['peft']}. Median of {result['repeats']} steps after "
             f"{result['warmup']} warm-up. MFU peak: {peak['peak_source']}.", "",
             *([f"**Warning: {busy_warning(result)}.**", ""] if busy_warning(result) else []),
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, w in result["workloads"].items():
        for stack in ("wfm_jax", "torch"):
            rec = w["stacks"].get(stack)
            if rec is None:
                continue
            if rec["status"] != "ok":
                lines.append(f"| {name} | {stack} | error: {rec['error'][:80]} |" + " |" * 6)
                continue
            lines.append("| " + " | ".join([
                name, stack, _num(rec["step_time_s"], ".1f", 1e3),
                _num(rec["samples_per_s"], ".2f"), _num(rec["flops_per_step"], ".3g", 1e-12),
                _num(rec["tflops_per_s"], ".3g"), _num(rec["mfu"], ".1%"),
                gib(rec["peak_memory_bytes"]),
                _num(rec["compile_time_s"], ".1f")]) + " |")
        r = w["ratio_wfm_jax_over_torch"]
        lines.append("| " + " | ".join([
            name, "**wfm_jax / torch**", _ratio(r["step_time_s"]), _ratio(r["samples_per_s"]),
            "", _ratio(r["tflops_per_s"]), _ratio(r["mfu"]), _ratio(r["peak_memory_bytes"]),
            _ratio(r["compile_time_s"])]) + " |")
    lines += ["", "step time ratio < 1 and samples/s ratio > 1 mean wfm_jax is faster. "
              "Peak memory: " + _memory_note(result) + " Torch runs eager unless noted, so its "
              "compile time is n/a."]
    return "\n".join(lines) + "\n"


def _memory_note(result: dict) -> str:
    notes = {}
    for name, w in result["workloads"].items():
        for stack, rec in w["stacks"].items():
            note = rec.get("notes", {}).get("peak_memory_bytes")
            if name != "reward" and rec.get("status") == "ok" and note:
                notes.setdefault(stack, note)
    return "; ".join(f"{s}: {n}" for s, n in notes.items()) + "." if notes else "see the JSON."


# ----------------------------------------------------------------------------- files

def write_json_atomic(obj, path: str) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write(result: dict, json_path: str) -> str:
    """results.json and results.md beside it (both atomically); returns the markdown."""
    md = markdown(result)
    write_json_atomic(result, json_path)
    write_text_atomic(os.path.splitext(json_path)[0] + ".md", md)
    return md
