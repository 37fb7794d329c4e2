"""What a compiled program costs, from XLA's own analysis: bytes (arguments, temporaries,
outputs, donated aliases), matmul FLOPs counted on the traced jaxpr, and the bytes its
collectives move. The planner reports these; the benchmark puts them beside its timings."""
from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# bytes per element of HLO's primitive types (4-bit types rounded up: a bound is enough here);
# collective_bytes and the planner's HLO reader (plan/hlo_cost.py) share it
DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
               "f8e4m3b11fnuz": 1, "f8e4m3": 1, "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 1}


class CompileStats(TypedDict):
    compile_seconds: float
    argument_bytes: int
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    flops: float                  # matmul + conv FLOPs of the whole program (all devices)
    xla_flops_per_device: float   # XLA's cost analysis (loop bodies once)
    collective_bytes: dict[str, int]
    generated_code_bytes: int     # the executable itself (on TPU it sits in HBM beside the data)
    optimal_seconds: float        # XLA's cost-model time per device (TPU; loop bodies once), else 0
    xla_bytes_accessed: float     # XLA's cost analysis: HBM traffic per device (loop bodies once)
    custom_calls: dict[str, int]  # kernel custom calls in the optimized HLO (pallas_tpu, cudnn_fmha)


class CompileStatsHlo(CompileStats, total=False):
    hlo: dict                     # compile_stats(analyze_hlo=...)'s reading of the optimized HLO


# custom-call targets of the attention kernels: Mosaic (Pallas on TPU) and cuDNN's fused attention
_CUSTOM_CALLS = {"pallas_tpu": 'custom_call_target="tpu_custom_call"',
                 "cudnn_fmha": 'custom_call_target="__cudnn$fmha'}


def custom_calls(hlo_text: str) -> dict[str, int]:
    """How many calls of each attention kernel an optimized HLO module holds (a call inside a
    while loop body counts once, as written)."""
    return {name: hlo_text.count(target) for name, target in _CUSTOM_CALLS.items()}


def per_device_bytes(tree) -> int:
    """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs carrying shardings; one
    without a sharding counts whole, as a replicated value)."""
    import jax
    return sum(math.prod(x.shape if x.sharding is None else x.sharding.shard_shape(x.shape))
               * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "sharding"))


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of the results of each kind of collective in an optimized HLO module (per device,
    per step; ops inside a while loop body are counted once, as written)."""
    out = dict.fromkeys(_COLLECTIVES, 0)
    for line in hlo_text.splitlines():
        m = re.search(r"= (.+?) (" + "|".join(_COLLECTIVES) + r")(-start)?\(", line)
        if not m:
            continue
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
            if dtype in DTYPE_BYTES:
                out[m.group(2)] += DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return out


# The program is compiled to be measured, never run: on the CPU, LLVM's optimisation of its code
# is wasted time (XLA assigns the same buffers at every level; level 0 compiles the tiny SD3
# step about a quarter faster). Other backends have their own compilers: nothing is passed.
CPU_COMPILE_ONLY = {"xla_backend_optimization_level": 0}


class Lowering(NamedTuple):
    """A program traced and lowered for its first call's shapes, not yet compiled: `text` (the
    lowered module) names what the compiler will be given (the planner's cache keys on it)."""
    traced: Any
    lowered: Any
    options: dict | None  # the compiler options compile() is given (CPU_COMPILE_ONLY or None)
    mesh: Any

    @property
    def text(self) -> str:
        return self.lowered.as_text()


def lower_program(fn, *args: Any) -> Lowering:
    """Trace and lower a MeshJit on (abstract) args as its first call would."""
    import jax

    from wfm_jax.core import mesh as wmesh
    from wfm_jax.models.layers.attention import target_device
    options = CPU_COMPILE_ONLY if target_device(fn.mesh).platform == "cpu" else None
    with jax.set_mesh(fn.mesh), wmesh.use_rules(fn.rules):  # what MeshJit.lower does
        traced = fn.jitted.trace(*args)
        return Lowering(traced, traced.lower(), options, fn.mesh)


def compile_lowered(lowering: Lowering,
                    analyze_hlo: Callable[[str], dict] | None = None) -> CompileStatsHlo:
    """Compile a lowered program and read XLA's memory and cost analysis of it, its matmul
    FLOPs and collective bytes. analyze_hlo: a reader of the optimized HLO text whose result is
    added under "hlo" (the planner's loop accounting, plan/hlo_cost.py: the text itself is not
    kept)."""
    import jax

    with jax.set_mesh(lowering.mesh):
        start = time.perf_counter()
        compiled = lowering.lowered.compile(lowering.options)
        seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    hlo = compiled.as_text()
    out: CompileStatsHlo = {
        "compile_seconds": round(seconds, 1),
        "argument_bytes": int(m.argument_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "alias_bytes": int(m.alias_size_in_bytes),
        # matmul + conv FLOPs of the whole program (all devices; scans x their length, remat's
        # recompute included); XLA's cost analysis counts a loop body once, so it is given
        # alongside, per device, as XLA reports it
        "flops": count_jaxpr_flops(lowering.traced.jaxpr),
        "xla_flops_per_device": float(cost.get("flops", 0.0)),
        "collective_bytes": collective_bytes(hlo),
        "generated_code_bytes": int(m.generated_code_size_in_bytes),
        "optimal_seconds": float(cost.get("optimal_seconds", 0.0)),
        "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "custom_calls": custom_calls(hlo),
    }
    if analyze_hlo is not None:
        out["hlo"] = analyze_hlo(hlo)
    return out


def compile_stats(fn, *args: Any,
                  analyze_hlo: Callable[[str], dict] | None = None) -> CompileStatsHlo:
    """Trace, lower and compile a MeshJit on (abstract) args as its first call would, and read
    XLA's analysis of the program (compile_lowered)."""
    return compile_lowered(lower_program(fn, *args), analyze_hlo)


# Pallas kernels that recompute what the model count takes once: JAX's TPU flash attention's
# backward. Of the 6 matmul units (2 x B x N x T x S x H each) a model-FLOP count gives
# attention's forward and backward, the forward kernel runs 2 (QK^T, PV); the dK/dV kernel 4
# (QK^T again, dO V^T, P^T dO, dS^T Q), 3 of them the model's; the dQ kernel 3 (QK^T and
# dO V^T again, dS K), 1 of them the model's: 9 run for 6 counted.
PALLAS_MODEL_FRACTION = {"flash_mha_bwd_dkv": 3 / 4, "flash_mha_bwd_dq": 1 / 3}


def count_jaxpr_flops(closed_jaxpr) -> float:
    """Matmul + convolution FLOPs of a (closed) jaxpr, walking sub-jaxprs (pjit, remat,
    custom_vjp, scan x length, a shard_map's body x its shards; remat's recompute included).
    An independent check of bench.flops' formulas. A Pallas kernel counts its body once per
    grid cell (every branch of a `cond` in it: a kernel that skips blocks at run time, e.g.
    causal attention, is over-counted), times the model's share of what it computes
    (PALLAS_MODEL_FRACTION: the flash backward's own recomputation is left out; a remat
    policy's recompute of the forward kernel, as of a dot, is not)."""
    jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            total += _pallas_flops(eqn)
            continue
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "conv_general_dilated":
            total += _conv_flops(eqn)
        inner = sum(count_jaxpr_flops(sub) for sub in _sub_jaxprs(eqn.params))
        total += inner * (eqn.params.get("length", 1) if name == "scan" else 1) * _shards(eqn)
    return total


def _shards(eqn) -> int:
    """How many copies of a shard_map's body run (its body holds one shard's shapes): the
    product of the mesh axes it makes manual; 1 for any other primitive."""
    if eqn.primitive.name != "shard_map":
        return 1
    shape = dict(getattr(eqn.params.get("mesh"), "shape", {}))
    manual = eqn.params.get("newly_manual_axes", eqn.params.get("manual_axes", ()))
    return math.prod(int(shape.get(a, 1)) for a in manual)


def _pallas_flops(eqn) -> float:
    grid = eqn.params["grid_mapping"].grid
    cells = math.prod(int(g) for g in grid) if all(isinstance(g, int) for g in grid) else 1
    scope = str(eqn.source_info.name_stack)
    share = next((f for kernel, f in PALLAS_MODEL_FRACTION.items() if kernel in scope), 1.0)
    return count_jaxpr_flops(eqn.params["jaxpr"]) * cells * share


def _sub_jaxprs(params: dict):
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns"):
                yield v


def _dot_flops(eqn) -> float:
    (_, rc), (_, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    rhs_free = [d for i, d in enumerate(rhs) if i not in rc and i not in rb]
    return 2.0 * math.prod(lhs) * math.prod(rhs_free)


def _conv_flops(eqn) -> float:
    out = eqn.outvars[0].aval.shape
    rhs = eqn.invars[1].aval.shape
    spec = eqn.params["dimension_numbers"].rhs_spec  # (out_ch, in_ch, *spatial) positions
    kernel = math.prod(rhs[i] for i in spec[2:]) * rhs[spec[1]]
    return 2.0 * math.prod(out) * kernel
