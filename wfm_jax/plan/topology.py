"""Planning for a TPU topology described in software (`--topology v5p:2x2x1`), on a machine with
no TPU: libtpu's compiler builds the real TPU executables from the topology's compile-only
devices (/work/shared/specs/tpu_aot.md). Here: those devices and what the chip offers (HBM, peak
FLOP/s), a compile failure turned into a result (RESOURCE_EXHAUSTED: does not fit, the bytes
from the message), the cost model's step time and MFU, and the attention kernel a compiled
program runs."""
from __future__ import annotations

import importlib.util
import math
import os
import re
from collections.abc import Callable

GiB = 2 ** 30

# per chip: HBM and peak dense bf16 FLOP/s (Cloud TPU's published figures), by jax device_kind.
# A topology device may be a part of a chip (v4 describes one device per TensorCore, 2 a chip):
# each device gets its share (chip_share).
CHIPS = {
    "TPU v4": ("v4", 32 * GiB, 275e12),
    "TPU v5 lite": ("v5e", 16 * GiB, 197e12),
    "TPU v5": ("v5p", 95 * GiB, 459e12),
    "TPU v6 lite": ("v6e", 32 * GiB, 918e12),
}
# The TPU cost model's own rates per device, read off `optimal_seconds` of single-op programs
# (2026-11-27, libtpu 0.0.42.1): a bf16 matmul of transformer shape (4096x1536 @ 1536x6144), in
# FLOP/s, and an elementwise bf16 program (a * b + 1 on 2^24 elements), in HBM bytes/s (the cost
# model charges elementwise programs of every size at exactly this rate; matmuls at 0.5-0.86 of
# the chip's peak, more for larger ones). hlo_cost weighs each instruction of a program at these
# rates to apportion the cost model's seconds between loop bodies and the rest.
COST_MODEL_RATES = {
    "TPU v4": (1.077e14, 4.912e11),       # one TensorCore (v4 describes one device per core)
    "TPU v5 lite": (1.562e14, 7.377e11),
    "TPU v5": (3.386e14, 2.350e12),
    "TPU v6 lite": (5.933e14, 1.638e12),
}
ESTIMATE_METHOD = (
    "XLA's TPU cost model (optimal_seconds, per device), which counts every while-loop body "
    "once, x loop_scale from the compiled HLO (plan/hlo_cost.py): each loop's trip count (from "
    "its condition) and its body's share of the program's time, weighing every instruction on "
    "a roofline at the cost model's own matmul and HBM rates; loop bodies count once per trip, "
    "the rest of the program (optimizer update, embeddings, loss) once; plus the matmuls of "
    "the Pallas kernels that declare no cost (flash attention's backward: kernel_seconds), at "
    "the matmul rate. An estimate, not a "
    "measurement. MFU = FLOPs per device / (estimated seconds x the device's peak bf16 FLOP/s)")
# estimate_method per program: how its estimated_step_seconds was made
METHODS = {
    "hlo_loops": ("optimal_seconds x loop_scale, loop_scale from the compiled HLO's loops, "
                  "+ kernel_seconds where the program runs undeclared Pallas kernels"),
    "flop_ratio": ("optimal_seconds x (jaxpr FLOPs / XLA FLOPs), the whole program scaled: "
                   "used only where the HLO was not read; over-states a program whose non-loop "
                   "part is large"),
    "none": "no estimate (estimate_note says why)",
}


def _fail(msg: str):
    raise SystemExit(f"wfm_jax.plan: {msg}")


def prepare_environment() -> None:
    """Before jax starts its backend: stay on CPU (the topology's devices are compile-only) and
    let libtpu load in more than one process (there is no TPU to share: without it a second
    process aborts on libtpu's lockfile)."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    if jax.config.jax_platforms != "cpu":
        jax.config.update("jax_platforms", "cpu")


def topology_devices(name: str, num_slices: int = 1) -> tuple[list, dict]:
    """The compile-only devices of topology `name` (e.g. v5p:2x2x1, v5e:2x2, v6e:2x2) and
    {topology, device_kind, chip, chips, devices, hbm_bytes, peak_flops} per device; one line
    and exit 2 when libtpu is missing or the name is not a topology libtpu knows."""
    if name.split(":")[0].lower() in ("h100", "h200", "a100", "b200", "gpu", "cuda"):
        _fail(f"--topology {name}: JAX cannot compile for a GPU without one (get_topology_desc: "
              f"'topology not implemented for cuda'); plan GPUs with --devices N --device-kind "
              f"h100|h200 (CPU compile)")
    if importlib.util.find_spec("libtpu") is None:
        _fail("--topology needs libtpu, the TPU compiler: pip install 'jax[tpu]==0.10.2' "
              "(no TPU needed)")
    prepare_environment()
    import jax
    from jax.experimental import topologies
    try:
        desc = topologies.get_topology_desc(name, platform="tpu", num_slices=num_slices)
    except (jax.errors.JaxRuntimeError, ValueError) as e:
        _fail(f"--topology {name!r}: {first_line(e)} (e.g. v5p:2x2x1, v5e:2x2, v4:2x2x1, v6e:2x2)")
    devices = list(desc.devices)
    kind = devices[0].device_kind
    if kind not in CHIPS:
        _fail(f"--topology {name}: device kind {kind!r} has no HBM / peak entry (known: "
              f"{', '.join(CHIPS)})")
    chip, chip_hbm, chip_peak = CHIPS[kind]
    chips = math.prod(int(v) for v in name.split(":")[1].split("_")[0].split("x")) * num_slices
    share = max(1, len(devices) // chips)  # devices per chip
    return devices, {"topology": name, "num_slices": num_slices, "device_kind": kind,
                     "chip": chip, "chips": chips, "devices": len(devices),
                     "hbm_bytes": chip_hbm // share, "peak_flops_per_device": chip_peak / share,
                     "peak_table": {c: p for c, _, p in CHIPS.values()}}


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "M": 2 ** 20, "G": GiB, "T": 2 ** 40}
# "... the total memory required for HLO temporaries (108.42G) exceeds available HBM (95.74G)";
# "Used 110.50G of 95.74G hbm. Exceeded hbm capacity by 14.76G."
_NEEDS = (re.compile(r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"),
          re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm"))


def compile_failure(e: BaseException) -> dict:
    """A program the compiler refused, as a result: its first line; for RESOURCE_EXHAUSTED,
    fits False with the bytes the message names (XLA's G is GiB)."""
    line = first_line(e)
    out = {"compiled": False, "error": line, "fits": None}
    if "RESOURCE_EXHAUSTED" in str(e):
        out["fits"] = False
        for pattern in _NEEDS:
            m = pattern.search(str(e))
            if m:
                out["required_bytes"] = int(float(m.group(1)) * _UNITS[m.group(2)])
                out["compiler_hbm_bytes"] = int(float(m.group(3)) * _UNITS[m.group(4)])
                break
    return out


def attention_kernel(stats: dict, resolved: str) -> str:
    """The attention kernel the compiled program runs: pallas (Mosaic custom calls in its HLO),
    cudnn (cuDNN fused attention calls), else the plain-JAX kernel "auto" resolved to (xla or
    blockwise: both plain HLO)."""
    calls = stats.get("custom_calls", {})
    if calls.get("pallas_tpu"):
        return "pallas"
    if calls.get("cudnn_fmha"):
        return "cudnn"
    return resolved if resolved in ("xla", "blockwise") else "xla"


def hlo_reader(device, keep: str | None = None) -> Callable[[str], dict] | None:
    """What compile_stats runs on a program's optimized HLO for `device` (one of the program's
    mesh devices): hlo_cost.analyze at the cost model's rates for a TPU device, None elsewhere
    (CPU and GPU compiles have no cost model to apportion). keep: a file the HLO text is also
    written to (plan --hlo-dir: to read a tuning's effect instruction by instruction)."""
    rates = COST_MODEL_RATES.get(getattr(device, "device_kind", None))
    if getattr(device, "platform", None) != "tpu" or rates is None:
        return None

    def read(text: str) -> dict:
        from wfm_jax.plan import hlo_cost
        if keep:
            with open(keep, "w") as f:
                f.write(text)
        try:
            return hlo_cost.analyze(text, *rates)
        except (ValueError, KeyError, IndexError) as e:  # a format it cannot read: said, not fatal
            return {"error": f"{type(e).__name__}: {first_line(e)}"}
    return read


def estimate(stats: dict, devices: int, peak_flops: float) -> dict:
    """The cost model's step time, loop-corrected, and MFU of one compiled program.
    `optimal_seconds` counts each while body once; with the HLO read (stats["hlo"]: hlo_cost)
    it is multiplied by the HLO's loop factor (the bodies x their trip counts, the rest once:
    estimate_method "hlo_loops"); without it by jaxpr FLOPs / XLA FLOPs ("flop_ratio"). A
    program scaled from two compiles of fewer blocks (compiled.scale_linear): each compile's
    estimate, extrapolated as its bytes are."""
    if stats.get("scaled_from") and stats.get("scale_factor") is not None:
        return _scaled_estimate(stats, devices, peak_flops)
    flops_dev = stats["flops"] / devices
    xla = stats.get("xla_flops_per_device", 0.0)
    seconds = stats.get("optimal_seconds", 0.0)
    if seconds <= 0:
        # CPU has no cost model; a negative one is no estimate (seen: -1 for a program with
        # Ulysses' all-to-all on v5p, -14.8 for v5e's SFT step)
        return {"flops_per_device": flops_dev, "estimated_step_seconds": None,
                "estimated_mfu": None, "loop_scale": None, "estimate_method": "none",
                "estimate_note": f"no estimate: XLA's cost model gave optimal_seconds={seconds:.4g}"}
    hlo = stats.get("hlo") or {}
    out = {"flops_per_device": flops_dev}
    if hlo.get("loop_factor"):
        scale, out["estimate_method"] = hlo["loop_factor"], "hlo_loops"
        if hlo.get("unknown_loops"):
            out["estimate_note"] = (f"{hlo['unknown_loops']} while loop(s) of a trip count the "
                                    f"HLO does not give (e.g. a decode loop that stops at EOS) "
                                    f"counted once: an under-estimate")
    else:
        scale, out["estimate_method"] = (max(1.0, flops_dev / xla) if xla else 1.0), "flop_ratio"
        if hlo.get("error"):
            out["estimate_note"] = f"the HLO was not read ({hlo['error']})"
    # the Pallas kernels that declare no cost (flash attention's backward): their matmuls at
    # the cost model's rate, which gives them nothing (hlo_cost.UNDECLARED_KERNELS)
    kernel = hlo.get("kernel_seconds") or 0.0
    t = seconds * scale + kernel
    if kernel:
        out["kernel_seconds"] = kernel
    if hlo.get("undeclared_kernels"):
        said = (f"{hlo['undeclared_kernels']} Pallas kernel call(s) that declare no cost and are "
                f"not in the planner's table counted by the bytes they move: an under-estimate")
        out["estimate_note"] = "; ".join(filter(None, (out.get("estimate_note"), said)))
    out.update({"estimated_step_seconds": t,
                "estimated_mfu": flops_dev / (t * peak_flops) if flops_dev else None,
                "loop_scale": scale})
    return out


def _scaled_estimate(stats: dict, devices: int, peak_flops: float) -> dict:
    parts = stats["scaled_from"]
    each = [estimate(m, devices, peak_flops) for m in parts]
    for m, e in zip(parts, each):  # each compile's own estimate, beside its raw figures
        m["estimated_step_seconds"], m["loop_scale"] = e["estimated_step_seconds"], e["loop_scale"]
        m["estimate_method"] = e["estimate_method"]
        if e.get("kernel_seconds"):
            m["kernel_seconds"] = e["kernel_seconds"]
    flops_dev = stats["flops"] / devices
    ta, tb = (e["estimated_step_seconds"] for e in each)
    t = None if ta is None or tb is None else ta + (tb - ta) * stats["scale_factor"]
    ka, kb = (e.get("kernel_seconds", 0.0) for e in each)
    notes = [e["estimate_note"] for e in each if e.get("estimate_note")]
    if t is None or t <= 0:
        return {"flops_per_device": flops_dev, "estimated_step_seconds": None,
                "estimated_mfu": None, "loop_scale": None, "estimate_method": "none",
                "estimate_note": "; ".join(notes) or f"no estimate: {t:.4g} s extrapolated"}
    seconds = stats.get("optimal_seconds") or 0.0
    methods = sorted({e["estimate_method"] for e in each})
    out = {"flops_per_device": flops_dev, "estimated_step_seconds": t,
           "estimated_mfu": flops_dev / (t * peak_flops) if flops_dev else None,
           # by how much the extrapolated XLA seconds were scaled (each compile's own: scaled_from)
           "loop_scale": t / seconds if seconds > 0 else None,
           "estimate_method": "+".join(methods) + ", each compile's, extrapolated"}
    if ka or kb:  # the undeclared kernels' part of t, extrapolated alike
        out["kernel_seconds"] = ka + (kb - ka) * stats["scale_factor"]
    if notes:
        out["estimate_note"] = notes[-1]
    return out


def program_fields(p: dict, topo: dict, devices: int, configured_impl) -> None:
    """Add the --topology fields to one program's report `p` (in place): bytes_per_device,
    hbm_bytes (the device's), fits, flops_per_device, the estimates, attention_kernel, donated."""
    p["hbm_bytes"] = topo["hbm_bytes"]
    if not p["compiled"]:
        p.update({"bytes_per_device": {"argument": p["argument_bytes"],
                                       "temp": p.get("required_bytes")},
                  "flops_per_device": None, "estimated_step_seconds": None,
                  "estimated_mfu": None, "attention_kernel": None, "donated": None})
        return
    p["bytes_per_device"] = {k: p[f"{k}_bytes"] for k in ("argument", "output", "alias", "temp",
                                                          "generated_code")}
    p["fits"] = p["peak_bytes"] <= topo["hbm_bytes"]
    p.update(estimate(p, devices, topo["peak_flops_per_device"]))
    impl = configured_impl if configured_impl in ("xla", "blockwise") else "xla"
    p["attention_kernel"] = attention_kernel(p, impl)
    p["donated"] = p["alias_bytes"] > 0
