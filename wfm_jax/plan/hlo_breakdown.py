"""Where a compiled TPU program's time goes, by kind of instruction and by the source line that
traced it: plan/hlo_cost.analyze's `breakdown`, what one tunes a step against (a memory-bound
fusion repeated per block, an un-overlapped gather, prefetches). The source lines come from the
HLO's stack-frame tables, which jax 0.10.2 writes in place of metadata's source_file."""
from __future__ import annotations

import re
from typing import Protocol


class Instruction(Protocol):  # hlo_cost.Instruction, as far as this module reads it
    name: str
    type: str
    opcode: str
    attrs: str


class Module(Protocol):  # hlo_cost.Module: its stack frames, read by stack_sources
    frames: dict[int, str]

_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def stack_sources(text: str, depth: int = 2) -> dict[int, str]:
    """{stack_frame_id: "dir/file.py:line < dir/caller.py:line"}: where the instructions of a
    frame were traced, from the module's stack-frame tables (what jax writes in place of
    source_file in metadata): the innermost `depth` frames outside installed packages (a Pallas
    kernel's caller, not the kernel's library). A frame's parent_frame_id is its parent's id + 1, 0
    for none, as jax 0.10.2 writes it."""
    tables: dict[str, dict[int, str]] = {t: {} for t in _TABLES}
    table = None
    for line in text.splitlines():
        if line in _TABLES:
            table = line
            continue
        m = re.match(r"(\d+) (.*)$", line) if table else None
        if table is None or m is None:
            table = None if not line.startswith(" ") and table and line.strip() else table
            continue
        tables[table][int(m.group(1))] = m.group(2)

    def field(row: str, key: str) -> int:
        m = re.search(rf"\b{key}=(\d+)", row)
        return int(m.group(1)) if m else 0

    out = {}
    for frame in tables["StackFrames"]:
        here, seen, chain = frame, set(), list[str]()
        while here in tables["StackFrames"] and here not in seen and len(chain) < depth:
            seen.add(here)
            row = tables["StackFrames"][here]
            loc = tables["FileLocations"].get(field(row, "file_location_id"), "")
            name = tables["FileNames"].get(field(loc, "file_name_id"), "").strip('"') if loc else ""
            if name and "site-packages" not in name and not name.startswith("<"):
                chain.append(_where(name, field(loc, "line")))
            here = field(row, "parent_frame_id") - 1
        if chain:
            out[frame] = " < ".join(chain)
    return out


def _where(path: str, line: int) -> str:
    """A source line as the breakdown names it: "dir/file.py:N"."""
    return "/".join(path.split("/")[-2:]) + f":{line}"


_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_FRAME = re.compile(r"\bstack_frame_id=(\d+)")


def _origin(ins: Instruction, module: Module) -> tuple[str, str]:
    """(the jax op an instruction came from, e.g. "jit(step)/jvp()/.../dot_general"; the source
    line that traced it, as "package/file.py:N"), as far as its metadata says."""
    name, source = _OP_NAME.search(ins.attrs), _SOURCE.search(ins.attrs)
    where = ""
    if source:
        where = _where(source.group(1), int(source.group(2)))
    elif (frame := _FRAME.search(ins.attrs)) is not None:
        where = module.frames.get(int(frame.group(1)), "")
    return (name.group(1) if name else ""), where


def _kind(ins: Instruction, f: float, b: float, matmul_rate: float, hbm_rate: float) -> str:
    """What bounds an instruction on the roofline: a collective, an asynchronous copy (memory
    space assignment's prefetch into on-chip memory, S(1), and its eviction), a Pallas kernel,
    a matmul at the matmul rate ("matmul"), one held back by its bytes ("matmul_memory_bound"),
    or bytes alone ("memory": elementwise, reductions, transposes, slices)."""
    if ins.opcode.removesuffix("-start") in _COLLECTIVES:
        return "collective"
    if ins.opcode == "copy-start":
        return "async_copy"
    if ins.opcode == "custom-call":  # what reaches here costs something: a kernel
        return "pallas" if "tpu_custom_call" in ins.attrs else "custom_call"
    if f > 0:
        return "matmul" if f / matmul_rate >= b / hbm_rate else "matmul_memory_bound"
    return "memory"


def breakdown(spent: list, total: float, matmul_rate: float, hbm_rate: float, module: Module,
              top: int = 15) -> dict:
    """Where the roofline's loop-counted time goes: seconds per kind (_kind) and the `top`
    instructions by time, each with its shape, runs, bound and the jax op it came from (what
    one tunes against: a memory-bound fusion repeated per block, an un-overlapped gather)."""
    kinds: dict[str, float] = {}
    lines: dict[tuple[str, str], float] = {}  # (kind, source line): seconds
    read = []  # each instruction's kind and origin, read once
    for t, ins, s, f, b in spent:
        k, (op_name, source) = _kind(ins, f, b, matmul_rate, hbm_rate), _origin(ins, module)
        kinds[k] = kinds.get(k, 0.0) + t
        lines[(k, source or "?")] = lines.get((k, source or "?"), 0.0) + t
        read.append((t, ins, s, f, b, k, op_name, source))
    rows = []
    for t, ins, s, f, b, k, op_name, source in sorted(read, key=lambda x: -x[0])[:top]:
        rows.append({"name": ins.name, "opcode": ins.opcode,
                     "type": re.sub(r"\{[^}]*\}", "", ins.type)[:120], "kind": k,
                     "runs": round(t / s), "seconds": t, "share": t / total if total else 0.0,
                     "flops": f, "bytes": b, "op_name": op_name[-160:], "source": source})
    share = (lambda v: v / total) if total else (lambda v: 0.0)
    return {"seconds_by_kind": kinds, "share_by_kind": {k: share(v) for k, v in kinds.items()},
            "top": rows,
            # the source lines whose instructions take the most time, per kind
            "top_sources": [{"kind": k, "source": src, "seconds": v, "share": share(v)}
                            for (k, src), v in sorted(lines.items(), key=lambda kv: -kv[1])[:top]]}
