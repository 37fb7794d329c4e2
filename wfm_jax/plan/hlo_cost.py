"""Where a compiled program's time goes, loop by loop, from its optimized HLO text: what XLA's
cost analysis does not say. `optimal_seconds` (XLA's TPU cost model) counts every `while` body
once, whatever its trip count; the program runs the body once per trip. This module reads the
program's computations, the trip count of each while loop (the compiler's known_trip_count, or
its condition `i < N` with the counter's constant start), and a roofline time per top-level
instruction: the larger of its matmul FLOPs at a matmul rate and the HBM bytes it reads and
writes at an HBM rate (topology.COST_MODEL_RATES: the cost model's own, per chip).

`loop_factor` = (roofline time, every computation counted once per run) / (roofline time, each
counted once, as XLA counts): topology.estimate multiplies the cost model's seconds by it. The
loop bodies are so multiplied by their trip counts and the rest of the program (an optimizer
update, embeddings, the loss: memory-bound, few FLOPs) is not. The roofline only apportions
the cost model's own figure between the loops and the rest; its absolute value is not used
(it comes within 0.9-1.4x of the cost model's loop-once seconds on the programs measured:
docs/sharding_and_memory.md).

What an instruction costs, as the cost model was seen to count it: a fusion reads its operands
and writes its outputs, except what it only slices of an operand (a scan body's block of the
stacked weights) and an in-place dynamic-update-slice (the update only); bytes as laid out,
the minor dims padded to the layout's tile (T(8,128)); a copy that keeps its layout is free (a
DMA beside compute), one that changes it is not; a Pallas kernel costs what it declares
(cost_estimate); async copies and collectives count at their -start.

A Pallas kernel that declares no cost gets none from XLA either: jax's flash attention declares
its forward, not its two backward kernels, which do 3.5x the forward's matmuls. Those two are
counted here from their operands' shapes (`kernel_seconds`: their FLOPs at the matmul rate, per
run), which topology.estimate adds to the cost model's time; any other undeclared kernel is
counted in `undeclared_kernels` and said.

Text format: XLA's HloModule::ToString as jax 0.10.2 / libtpu 0.0.42.1 print it
(`%name = type opcode(%operand, ...), attr=value, ...`). A loop whose trip count it cannot read
is listed in `unknown_loops` and counted once, as XLA counts it; the caller says so."""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

from wfm_jax.plan.hlo_breakdown import breakdown, stack_sources
from wfm_jax.programs.stats import DTYPE_BYTES

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
# an array with its layout: minor-to-major dims and the first tile, {2,1,0:T(8,128)(2,1)S(1)}
_LAID_OUT = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([0-9,]*)(?::T\(([0-9,]+)\))?[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$")
# the FLOPs a Pallas kernel declares (its cost_estimate, in the custom call's backend config)
_DECLARED_FLOPS = re.compile(r'\\?"flops\\?"\s*:\s*\\?"?(\d+)')
_CALLS = re.compile(r"\b(calls|body|condition|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
# no data moved or computed at run time (bookkeeping, or counted at the matching -start)
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "partition-id",
         "replica-id", "after-all", "opt-barrier", "add-dependency", "iota", "domain",
         "copy-done", "all-gather-done", "all-reduce-done", "collective-permute-done",
         "async-done", "async-update", "send-done", "recv-done"}
_CONTROL = {"while", "call", "conditional"}  # their computations are walked on their own


@dataclasses.dataclass
class Instruction:
    name: str
    type: str            # result type as written: an array, or a tuple of them
    opcode: str
    args: str            # the text inside the parentheses ("4" for constant(4))
    operands: list[str]  # the instructions it reads
    attrs: str           # everything after the parentheses
    root: bool


@dataclasses.dataclass
class Module:
    computations: dict[str, list[Instruction]]
    entry: str
    named: dict[str, Instruction]  # every instruction by name (unique module-wide)
    frames: dict[int, str] = dataclasses.field(default_factory=dict)  # stack_frame_id: source
    _users: dict[str, dict[str, list[Instruction]]] = dataclasses.field(default_factory=dict)

    def users(self, computation: str) -> dict[str, list[Instruction]]:
        """The instructions of `computation` that read each value (by name)."""
        if computation not in self._users:
            users: dict[str, list[Instruction]] = {}
            for i in self.computations.get(computation, []):
                for o in i.operands:
                    users.setdefault(o, []).append(i)
            self._users[computation] = users
        return self._users[computation]


def _close(text: str, start: int) -> int:
    """Index just past the bracket group that opens at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({[":
            depth += 1
        elif text[i] in ")}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _instruction(line: str) -> Instruction | None:
    m = re.match(r"\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple type
        end = _close(rest, 0)
    else:
        end = 0
        while end < len(rest) and rest[end] != " ":
            end = _close(rest, end) if rest[end] in "({[" else end + 1
    type_, rest = rest[:end], rest[end:].lstrip()
    op = re.match(r"([a-z][\w\-]*)\(", rest)
    if not op:
        return None
    close = _close(rest, op.end() - 1)
    args = rest[op.end():close - 1]
    return Instruction(m.group(2), type_, op.group(1), args, re.findall(r"%([\w.\-]+)", args),
                       rest[close:], bool(m.group(1)))


def parse(text: str) -> Module:
    """The computations of an optimized HLO module's text."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            h = _HEADER.match(line)
            if h:
                current = h.group(2)
                computations[current] = []
                entry = current if h.group(1) else entry
            elif line.startswith("}"):
                current = None
            continue
        if current is not None:
            ins = _instruction(line)
            if ins is not None:
                computations[current].append(ins)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return Module(computations, entry, {i.name: i for c in computations.values() for i in c},
                  stack_sources(text))


def type_bytes(type_: str) -> int:
    """Bytes of every array in a type string (a tuple: all its elements), as laid out in HBM:
    the most-minor dims padded to the layout's first tile (T(8,128): 8 x 128 elements), which
    the cost model counts too (a tiny model's f32[4,4,384,8] takes 16x its elements)."""
    total = 0
    for m in _LAID_OUT.finditer(type_):
        dtype, dims, layout, tile = m.groups()
        if dtype not in DTYPE_BYTES:
            continue
        shape = [int(d) for d in dims.split(",") if d]
        if layout and tile and shape:
            order = [int(v) for v in layout.split(",") if v]
            for k, t in enumerate(reversed([int(v) for v in tile.split(",") if v])):
                if k < len(order) and order[k] < len(shape):
                    shape[order[k]] = -(-shape[order[k]] // t) * t
        total += DTYPE_BYTES[dtype] * math.prod(shape)
    return total


def _layout_free(type_: str) -> str:
    """A type without its memory space (S(1): on-chip), to compare layouts."""
    return re.sub(r"S\(\d+\)", "", type_)


def _dims(type_: str) -> list[int]:
    m = _ARRAY.search(type_)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _called(ins: Instruction) -> Iterator[tuple[str, str]]:
    yield from _CALLS.findall(ins.attrs)
    b = _BRANCHES.search(ins.attrs)
    if b:
        for name in b.group(1).split(","):
            yield "branch", name.strip().lstrip("%")


def _callee(ins: Instruction, key: str) -> str | None:
    return next((name for k, name in _called(ins) if k == key), None)


def _bytes_of(name: str, module: Module) -> int:
    ins = module.named.get(name)
    return type_bytes(ins.type) if ins is not None else 0


def _window(attrs: str, rank: int) -> dict[str, list[int]] | None:
    """A convolution's window: size, stride, padding (low, high), dilations, per spatial dim."""
    m = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(kv.split("=", 1) for kv in m.group(1).split()) if m else {}
    if "size" not in fields:
        return None if rank else {"size": [], "stride": [], "low": [], "high": [], "lhs": [],
                                  "rhs": []}

    def ints(key: str, default: int) -> list[int]:
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * rank
    pads = [p.split("_") for p in fields["pad"].split("x")] if "pad" in fields else [["0", "0"]] * rank
    return {"size": ints("size", 1), "stride": ints("stride", 1),
            "low": [int(p[0]) for p in pads], "high": [int(p[1]) for p in pads],
            "lhs": ints("lhs_dilate", 1), "rhs": ints("rhs_dilate", 1)}


def _valid_pairs(size: int, window: int, stride: int, low: int, lhs: int, rhs: int,
                 out: int) -> int:
    """(output position, kernel position) pairs of one spatial dim that land on an input element
    rather than on padding or between dilated inputs (XLA's HloCostAnalysis counts the same: the
    TPU compiler writes a batched matmul as a convolution whose batch dim is a window padded on
    both sides, one valid position per output)."""
    extent = (size - 1) * lhs + 1
    count = 0
    if lhs == 1:  # per kernel position, the outputs whose input lies in [0, extent)
        for k in range(window):
            first = max(0, -((k * rhs - low) // stride))      # ceil((low - k*rhs) / stride)
            stop = min(out, -((k * rhs - low - extent) // stride))
            count += max(0, stop - first)
        return count
    for k in range(window):
        for o in range(out):
            pos = o * stride + k * rhs - low
            if 0 <= pos < extent and pos % lhs == 0:
                count += 1
    return count


def _conv_flops(ins: Instruction, module: Module) -> float:
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.attrs)
    lhs_ins, rhs_ins = (module.named.get(o) for o in ins.operands[:2])
    if not labels or lhs_ins is None or rhs_ins is None:
        return 0.0
    lhs_l, rhs_l, out_l = labels.groups()
    lhs, rhs, out = _dims(lhs_ins.type), _dims(rhs_ins.type), _dims(ins.type)
    if not (len(lhs) == len(lhs_l) and len(rhs) == len(rhs_l) and len(out) == len(out_l)):
        return 0.0
    spatial = sorted(c for c in rhs_l if c.isdigit())
    window = _window(ins.attrs, len(spatial))
    if window is None or any(len(v) != len(spatial) for v in window.values()):
        return 0.0
    groups = re.search(r"feature_group_count=(\d+)", ins.attrs)
    batch_groups = re.search(r"batch_group_count=(\d+)", ins.attrs)
    positions = 1
    for j, d in enumerate(spatial):
        positions *= _valid_pairs(lhs[lhs_l.index(d)], window["size"][j], window["stride"][j],
                                  window["low"][j], window["lhs"][j], window["rhs"][j],
                                  out[out_l.index(d)])
    fma = (lhs[lhs_l.index("f")] // (int(groups.group(1)) if groups else 1)
           * rhs[rhs_l.index("o")]
           * lhs[lhs_l.index("b")] // (int(batch_groups.group(1)) if batch_groups else 1)
           * positions)
    return 2.0 * fma


def matmul_flops(ins: Instruction, module: Module) -> float:
    """FLOPs of a convolution or dot (the TPU compiler writes most dots as convolutions), as
    XLA's HloCostAnalysis counts them."""
    if ins.opcode == "convolution" and len(ins.operands) >= 2:
        return _conv_flops(ins, module)
    out = math.prod(_dims(ins.type))
    if ins.opcode == "dot" and ins.operands:
        lhs_ins = module.named.get(ins.operands[0])
        lhs = _dims(lhs_ins.type) if lhs_ins is not None else []
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
        contracted = [lhs[int(d)] for d in m.group(1).split(",") if d and int(d) < len(lhs)] \
            if m else []
        return 2.0 * out * math.prod(contracted)
    return 0.0


def _flops_in(computation: str | None, module: Module, seen: frozenset = frozenset()) -> float:
    """Matmul FLOPs of a fused (or wrapped) computation and whatever it calls."""
    if computation is None or computation in seen or computation not in module.computations:
        return 0.0
    total = 0.0
    for ins in module.computations[computation]:
        total += matmul_flops(ins, module)
        for _, name in _called(ins):
            total += _flops_in(name, module, seen | {computation})
    return total


def _fusion_bytes(ins: Instruction, fused: str | None, module: Module) -> float:
    """HBM bytes a fusion reads and writes: each operand whole, except one the fused
    computation only slices (the slices are read) or updates in place (nothing is read); the
    output whole, except an in-place dynamic-update-slice (its update is written). So a scan
    body's fusion that picks one block's weights from the stacked ones reads one block's."""
    body = module.computations.get(fused or "")
    if body is None:
        return float(type_bytes(ins.type) + sum(_bytes_of(o, module) for o in ins.operands))
    read = sum(_param_read(p, fused or "", module, 0) for p in body if p.opcode == "parameter")
    root = next((i for i in body if i.root), None)
    outs = ([module.named.get(o) for o in root.operands]
            if root is not None and root.opcode == "tuple" else [root])
    written = 0.0
    for out in outs:
        while out is not None and out.opcode == "bitcast" and out.operands:
            out = module.named.get(out.operands[0])
        if out is not None and out.opcode == "dynamic-update-slice" and len(out.operands) > 1:
            written += _bytes_of(out.operands[1], module)
        elif out is not None:
            written += type_bytes(out.type)
    return read + written


def _param_read(value: Instruction, computation: str, module: Module, depth: int) -> float:
    """Bytes read of a fused computation's parameter (or a bitcast of one): the slices taken of
    it when it is only sliced, nothing when it is only the buffer of an in-place
    dynamic-update-slice, what a nested fusion reads of it, else all of it."""
    uses = module.users(computation).get(value.name, [])
    if not uses or depth > 8:
        return float(type_bytes(value.type))
    total = 0.0
    for u in uses:
        if u.opcode in ("dynamic-slice", "slice") and u.operands[0] == value.name:
            total += type_bytes(u.type)
        elif u.opcode == "dynamic-update-slice" and u.operands[0] == value.name:
            continue
        elif u.opcode == "bitcast":
            total += _param_read(u, computation, module, depth + 1)
        elif u.opcode == "fusion":  # the nested computation's parameter(s) it is passed as
            nested = _callee(u, "calls") or ""
            params = {int(p.args): p for p in module.computations.get(nested, [])
                      if p.opcode == "parameter" and p.args.strip().isdigit()}
            for k, o in enumerate(u.operands):
                if o == value.name and k in params:
                    total += _param_read(params[k], nested, module, depth + 1)
        else:
            return float(type_bytes(value.type))
        if total >= type_bytes(value.type):
            return float(type_bytes(value.type))
    return total


def instruction_cost(ins: Instruction, module: Module) -> tuple[float, float]:
    """(matmul FLOPs, HBM bytes) of one top-level instruction; a control instruction's
    computations are walked on their own (nothing here)."""
    op = ins.opcode
    if op in _FREE or op in _CONTROL:
        return 0.0, 0.0
    moved = float(type_bytes(ins.type) + sum(_bytes_of(o, module) for o in ins.operands))
    if op == "fusion":
        fused = _callee(ins, "calls")
        return _flops_in(fused, module), _fusion_bytes(ins, fused, module)
    if op == "custom-call" and re.search(r'custom_call_target="(AllocateBuffer|'
                                         r'AssumeGatherIndicesInBound)"', ins.attrs):
        return 0.0, 0.0  # a buffer reserved, an assertion: nothing moved
    if op == "custom-call":  # a Pallas kernel: the cost it declares, when it declares one
        flops = _DECLARED_FLOPS.search(ins.attrs)
        accessed = re.search(r'\\?"bytes_accessed\\?"\s*:\s*\\?"?(\d+)', ins.attrs)
        return (float(flops.group(1)) if flops else 0.0,
                float(accessed.group(1)) if accessed else moved)
    if op == "copy" and ins.operands and _layout_free(ins.type) == _layout_free(
            module.named[ins.operands[0]].type if ins.operands[0] in module.named else ""):
        # a copy that keeps the layout is a DMA the cost model overlaps with compute (measured:
        # a scanned matmul with two such copies costs what the matmul alone does); a copy that
        # changes the layout (a transpose) it charges at the HBM rate
        return 0.0, 0.0
    if op == "dynamic-update-slice" and len(ins.operands) > 1:
        return 0.0, 2.0 * _bytes_of(ins.operands[1], module)
    if op in ("dynamic-slice", "slice"):
        return 0.0, 2.0 * type_bytes(ins.type)
    flops = matmul_flops(ins, module)
    for _, name in _called(ins):  # an async op's wrapped computation, a reduce's to_apply
        flops += _flops_in(name, module)
    return flops, moved


# Pallas kernels that declare no cost_estimate: matmul FLOPs per (batch x head x query token x
# key token x head dim), from jax's flash attention backward (pallas/ops/tpu/flash_attention.py):
# dK/dV recomputes Q K^T and computes P^T dO, dO V^T and dS^T Q (4 matmuls of 2 FLOPs a MAC);
# dQ recomputes Q K^T and computes dO V^T and dS K (3). Operands 0 and 1 are Q and K.
UNDECLARED_KERNELS = {"flash_mha_bwd_dkv": 8, "flash_mha_bwd_dq": 6}


def undeclared_kernel_flops(ins: Instruction, module: Module) -> float | None:
    """Matmul FLOPs of a Pallas kernel call that declares no cost: from UNDECLARED_KERNELS and
    its Q and K shapes ([batch, heads, tokens, head_dim], per device); 0.0 for a kernel it does
    not know; None for anything else (not a kernel, or one that declares its cost)."""
    if ins.opcode != "custom-call" or 'custom_call_target="tpu_custom_call"' not in ins.attrs \
            or _DECLARED_FLOPS.search(ins.attrs):
        return None
    per = next((f for kernel, f in UNDECLARED_KERNELS.items() if kernel in ins.name), None)
    q, k = (_dims(module.named[o].type) if o in module.named else [] for o in ins.operands[:2])
    if per is None or len(q) != 4 or len(k) != 4:
        return 0.0
    return float(per * q[0] * q[1] * q[2] * k[2] * q[3])


def _constant(name: str | None, module: Module) -> int | None:
    """The integer a scalar constant holds, through copies and converts."""
    ins = module.named.get(name or "")
    while ins is not None and ins.opcode in ("copy", "convert", "bitcast") and ins.operands:
        ins = module.named.get(ins.operands[0])
    if ins is None or ins.opcode != "constant":
        return None
    m = re.fullmatch(r"\s*(-?\d+)\s*", ins.args)
    return int(m.group(1)) if m else None


_FLIP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}


def trip_count(loop: Instruction, module: Module) -> int | None:
    """Iterations of a while loop whose condition is `counter <cmp> constant` (possibly fused)
    and whose counter starts at a constant, what lax.scan and fori_loop lower to (XLA may add
    counters of its own beside): None when the text does not say."""
    known = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', loop.attrs)
    if known:  # the compiler's own count, where it writes one
        return int(known.group(1))
    cond = _callee(loop, "condition")
    if cond not in module.computations or not loop.operands:
        return None
    root = next((i for i in module.computations[cond] if i.root), None)
    operands = root.operands if root is not None else []
    if root is not None and root.opcode == "fusion":  # a fused compare: read it inside
        fused = module.computations.get(_callee(root, "calls") or "", [])
        inner = next((i for i in fused if i.root), None)
        params = {i.name: int(i.args) for i in fused
                  if i.opcode == "parameter" and i.args.strip().isdigit()}
        if inner is None:
            return None
        operands = [root.operands[params[o]] if o in params and params[o] < len(root.operands)
                    else o for o in inner.operands]
        root = inner
    direction = re.search(r"direction=(\w+)", root.attrs) if root is not None else None
    if root is None or root.opcode != "compare" or direction is None or len(operands) != 2:
        return None
    d = direction.group(1)
    counter, bound = (module.named.get(o) for o in operands)
    if _constant(operands[0], module) is not None:  # the constant on the left
        counter, bound, d = bound, counter, _FLIP.get(d, d)
    limit = _constant(bound.name if bound is not None else None, module)
    if counter is None or counter.opcode != "get-tuple-element" or limit is None:
        return None
    index = re.search(r"index=(\d+)", counter.attrs)
    init = module.named.get(loop.operands[0])
    if index is None or init is None or init.opcode != "tuple":
        return None
    k = int(index.group(1))
    start = _constant(init.operands[k], module) if k < len(init.operands) else None
    if start is None:
        return None
    n = {"LT": limit - start, "LE": limit - start + 1, "GT": start - limit,
         "GE": start - limit + 1, "NE": abs(limit - start)}.get(d)
    return None if n is None else max(n, 0)


@dataclasses.dataclass
class Loop:
    body: str
    nested: int          # loops around it (0: in the entry computation, or what it calls)
    trips: int | None    # None: not read from the text; counted once, as XLA counts it
    runs: float          # how often the body runs in a program run (its trips x the loops around)
    seconds_once: float  # roofline seconds of one iteration (loops inside it once each)
    flops_once: float


def analyze(text: str, matmul_rate: float, hbm_rate: float) -> dict:
    """Read an optimized HLO module: each top-level instruction's time on a roofline (matmul
    FLOPs at `matmul_rate`, HBM bytes at `hbm_rate`, the larger of the two), counted once per
    computation as XLA's cost analysis counts, and once per run. Returns `loop_factor` (their
    ratio: what the cost model's loop-once seconds are multiplied by), `loops` (per while loop:
    trip count, runs, its body's share of the once-counted time), the parsed matmul FLOPs per
    device both ways (`flops_once` should match XLA's `flops`; `flops` the jaxpr count, plus the
    FLOPs Pallas kernels declare), and `unknown_loops`, the loops whose trip count is unknown."""
    module = parse(text)
    once = {"seconds": 0.0, "flops": 0.0}
    total = {"seconds": 0.0, "flops": 0.0}
    kernels = {"flops": 0.0, "seconds": 0.0, "unknown": 0}  # undeclared kernels, per run
    loops: list[Loop] = []
    spent: list[tuple[float, Instruction, float, float, float]] = []  # (s x runs, ins, s, f, b)

    def walk(name: str, weight: float, runs: float, depth: int, nested: int) -> tuple[float, float]:
        """(seconds, flops) of computation `name` once, loops inside it once each. weight: how
        much of it XLA's figure holds (1; a conditional's branch 1/branches), runs: how often
        it runs in a program run."""
        seconds = flops = 0.0
        if name not in module.computations or depth > 64:
            return 0.0, 0.0
        for ins in module.computations[name]:
            if ins.opcode == "while":
                trips = trip_count(ins, module)
                body = _callee(ins, "body") or ""
                inner = runs * (trips if trips is not None else 1)
                s, f = walk(body, weight, inner, depth + 1, nested + 1)
                loops.append(Loop(body, nested, trips, inner, s, f))
            elif ins.opcode in ("call", "conditional"):
                # a conditional: each branch as often as the others (in XLA's figure too)
                branches = [n for k, n in _called(ins) if k in ("to_apply", "branch", "calls")]
                s = f = 0.0
                for b in branches:
                    bs, bf = walk(b, weight / len(branches), runs / len(branches), depth + 1,
                                  nested)
                    s, f = s + bs / len(branches), f + bf / len(branches)
            else:
                f, b = instruction_cost(ins, module)
                s = max(f / matmul_rate, b / hbm_rate)
                extra = undeclared_kernel_flops(ins, module)
                if extra is not None:  # apart: the cost model's seconds do not hold it
                    kernels["flops"] += extra * runs
                    kernels["seconds"] += extra / matmul_rate * runs
                    kernels["unknown"] += extra == 0.0
                once["seconds"] += s * weight
                once["flops"] += f * weight
                total["seconds"] += s * runs
                total["flops"] += f * runs
                if s > 0:
                    spent.append((s * runs, ins, s, f, b))
            seconds, flops = seconds + s, flops + f
        return seconds, flops

    walk(module.entry, 1.0, 1.0, 0, 0)
    base = once["seconds"]
    return {"loop_factor": total["seconds"] / base if base > 0 else 1.0,
            # the roofline's own seconds (diagnostics: the cost model's loop-once seconds are
            # typically 1.0-1.5 x roofline_seconds_once)
            "roofline_seconds_once": base, "roofline_seconds": total["seconds"],
            "flops_once": once["flops"], "flops": total["flops"],
            "loops": [{"trips": x.trips, "runs": x.runs, "nested": x.nested,
                       "share": x.seconds_once / base if base > 0 else 0.0} for x in loops],
            "unknown_loops": sum(x.trips is None for x in loops),
            # the undeclared Pallas kernels (UNDECLARED_KERNELS), per run: not in the figures
            # above nor in XLA's; unknown ones are counted (by the bytes they move) and said
            "kernel_flops": kernels["flops"], "kernel_seconds": kernels["seconds"],
            "undeclared_kernels": kernels["unknown"],
            "breakdown": breakdown(spent, total["seconds"], matmul_rate, hbm_rate, module)}
