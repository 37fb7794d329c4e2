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
ESTIMATE_METHOD = ("XLA's TPU cost model (optimal_seconds, per device) x (jaxpr FLOPs / XLA FLOPs): "
                   "XLA counts a loop body once, the jaxpr count has every iteration; an estimate, "
                   "not a measurement. MFU = FLOPs per device / (estimated seconds x the device's "
                   "peak bf16 FLOP/s)")


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


def estimate(stats: dict, devices: int, peak_flops: float) -> dict:
    """The cost model's step time (loop-corrected) and MFU of one compiled program. A program
    scaled from two compiles of fewer blocks (compiled.scale_linear): each compile's
    loop-corrected time, extrapolated as its bytes are (scanned or not, each compile's loops
    are corrected for on its own; XLA's loop-once figures of a 1-block, unscanned model and
    of a scanned one do not extrapolate)."""
    if stats.get("scaled_from") and stats.get("scale_factor") is not None:
        return _scaled_estimate(stats, devices, peak_flops)
    flops_dev = stats["flops"] / devices
    xla = stats.get("xla_flops_per_device", 0.0)
    seconds = stats.get("optimal_seconds", 0.0)
    if seconds <= 0:
        # CPU has no cost model; a negative one is no estimate (seen: -1 for a program with
        # Ulysses' all-to-all on v5p, -14.8 for v5e's SFT step)
        return {"flops_per_device": flops_dev, "estimated_step_seconds": None,
                "estimated_mfu": None, "loop_scale": None,
                "estimate_note": f"no estimate: XLA's cost model gave optimal_seconds={seconds:.4g}"}
    scale = max(1.0, flops_dev / xla) if xla else 1.0
    t = seconds * scale
    return {"flops_per_device": flops_dev, "estimated_step_seconds": t,
            "estimated_mfu": flops_dev / (t * peak_flops) if flops_dev else None,
            "loop_scale": scale}


def _scaled_estimate(stats: dict, devices: int, peak_flops: float) -> dict:
    parts = stats["scaled_from"]
    each = [estimate(m, devices, peak_flops) for m in parts]
    for m, e in zip(parts, each):  # each compile's own estimate, beside its raw figures
        m["estimated_step_seconds"], m["loop_scale"] = e["estimated_step_seconds"], e["loop_scale"]
    flops_dev = stats["flops"] / devices
    ta, tb = (e["estimated_step_seconds"] for e in each)
    t = None if ta is None or tb is None else ta + (tb - ta) * stats["scale_factor"]
    if t is None or t <= 0:
        notes = [e["estimate_note"] for e in each if e.get("estimate_note")]
        return {"flops_per_device": flops_dev, "estimated_step_seconds": None,
                "estimated_mfu": None, "loop_scale": None,
                "estimate_note": "; ".join(notes) or f"no estimate: {t:.4g} s extrapolated"}
    seconds = stats.get("optimal_seconds") or 0.0
    return {"flops_per_device": flops_dev, "estimated_step_seconds": t,
            "estimated_mfu": flops_dev / (t * peak_flops) if flops_dev else None,
            # by how much the extrapolated XLA seconds were scaled (each compile's own: scaled_from)
            "loop_scale": t / seconds if seconds > 0 else None}


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
