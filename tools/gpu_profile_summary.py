"""Where the device time of a profiled step goes: reads the `*.xplane.pb` files that
`python -m wfm_jax.bench --profile DIR` writes (jax.profiler.ProfileData, no TensorBoard
needed) and sums kernel time per category and per kernel on each device plane.

    python tools/gpu_profile_summary.py DIR [--out summary.json] [--top 25]
        [--hlo MODULE.sm_9.0a_gpu_after_optimizations.txt --steps 3]

Categories come from kernel names (cuBLAS/CUTLASS/nvjet GEMMs, cuDNN/flash attention, NCCL,
copies, XLA's own fusions); the figure `busy` is kernel time over the XLA module span, which
says how much of a step the GPU sat idle (host, launch gaps).

--hlo (the step's optimised HLO, from XLA_FLAGS=--xla_dump_to=D --xla_dump_hlo_as_text
--xla_dump_hlo_module_re=jit_step) adds, per step, where XLA's own kernels came from: each
fusion kernel is matched to its HLO instruction, whose op_name names the phase (forward `jvp(`,
backward `transpose(`, the rest: optimizer, loss) and the operation (a layer scan's stacking of
its weights, its residuals' dynamic_update_slice, reductions...); library kernels (cuBLAS,
cuDNN) count in the phase of the XLA kernel before them. Gaps between kernels longer than
1 ms are listed: between steps they are the host's time to dispatch the next one."""
import argparse
import collections
import glob
import json
import os
import re

CATEGORIES = (  # first match wins: attention kernels also contain "gemm"-like words
    ("attention", re.compile(r"cudnn|fmha|flash|sdpa|attention", re.I)),
    ("collective", re.compile(r"nccl|all_reduce|all_gather|reduce_scatter", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|wgmma|matmul|dot", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
    ("convolution", re.compile(r"conv", re.I)),
    ("reduction", re.compile(r"reduce|reduction", re.I)),
)
SKIP_LINES = re.compile(r"XLA Modules|XLA Ops|Launch Stats|Steps|Source|TensorFlow|framework",
                        re.I)


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if pattern.search(name):
            return cat
    return "fusion/elementwise"


def summarise(path: str, data, top: int) -> dict:
    """`data`: the jax.profiler.ProfileData read from `path`."""
    out: dict = {"file": path, "planes": {}}
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        per_kernel: collections.Counter = collections.Counter()
        counts: collections.Counter = collections.Counter()
        modules = collections.Counter()
        lines = {}
        for line in plane.lines:
            events = list(line.events)
            lines[line.name] = len(events)
            if "XLA Modules" in line.name:
                for e in events:
                    modules[e.name] += e.duration_ns
                continue
            if SKIP_LINES.search(line.name):
                continue
            for e in events:
                per_kernel[e.name] += e.duration_ns
                counts[e.name] += 1
        if not per_kernel:
            continue
        per_cat: collections.Counter = collections.Counter()
        for name, ns in per_kernel.items():
            per_cat[category(name)] += ns
        kernel_ns = sum(per_kernel.values())
        module_ns = sum(modules.values())
        out["planes"][plane.name] = {
            "lines": lines,
            "kernel_ms": kernel_ns / 1e6,
            "module_ms": module_ns / 1e6,
            "busy": kernel_ns / module_ns if module_ns else None,
            "modules_ms": {k: v / 1e6 for k, v in modules.most_common(10)},
            "categories_ms": {k: v / 1e6 for k, v in per_cat.most_common()},
            "top_kernels": [{"name": k[:160], "ms": v / 1e6, "calls": counts[k],
                             "category": category(k)} for k, v in per_kernel.most_common(top)],
        }
    return out


def hlo_ops(path: str) -> dict[str, tuple[str, str]]:
    """kernel name (HLO instruction name, '.' and '-' as '_') -> (result shape, op_name)."""
    ops: dict[str, tuple[str, str]] = {}
    pattern = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (\S+?) .*?op_name="([^"]*)"', re.M)
    with open(path) as f:
        for m in pattern.finditer(f.read()):
            ops.setdefault(re.sub(r"[.\-]", "_", m.group(1)), (m.group(2), m.group(3)))
    return ops


def _op_kind(phase: str, shape: str, op_name: str) -> str:
    last = op_name.rsplit("/", 1)[-1]
    if last == "stack":
        return f"{phase}: stack (a scan's weights)"
    if "dynamic_update_slice" in op_name:
        dtype = "f32" if shape.lstrip("(").startswith("f32") else "other"
        return f"{phase}: dynamic_update_slice {dtype} (a scan's residuals / stacked grads)"
    return f"{phase}: {last}"


def phases(data, hlo: str, steps: int) -> dict:
    """Per-step kernel time by phase and by operation kind, and the long idle gaps, of the
    profile `data` (a jax.profiler.ProfileData)."""
    ops = hlo_ops(hlo)
    events = []
    for plane in data.planes:
        if plane.name.startswith("/device:"):
            for line in plane.lines:
                if "Compute" in line.name:
                    events += [(e.start_ns, e.duration_ns, e.name) for e in line.events]
    events.sort()
    per_phase: collections.Counter = collections.Counter()
    per_kind: collections.Counter = collections.Counter()
    gaps, phase, end = [], "start", None
    for start, dur, name in events:
        hit = ops.get(re.sub(r"_peeled_double_buffer(_\d+)?$", "", name))
        if hit is not None:
            shape, op_name = hit
            phase = ("backward" if "transpose(" in op_name else
                     "forward" if "jvp(" in op_name else "optimizer and rest")
            per_kind[_op_kind(phase, shape, op_name)] += dur
        per_phase[phase] += dur
        if end is not None and start - end > 1e6:
            gaps.append({"ms": (start - end) / 1e6, "before": name[:60]})
        end = max(end or 0, start + dur)
    return {"steps": steps,
            "phase_ms_per_step": {k: v / 1e6 / steps for k, v in per_phase.most_common()},
            "xla_kernel_ms_per_step": {k: v / 1e6 / steps for k, v in per_kind.most_common(30)},
            "gaps_over_1ms": sorted(gaps, key=lambda g: -g["ms"])[:20],
            "span_ms_per_step": (events[-1][0] + events[-1][1] - events[0][0]) / 1e6 / steps
            if events else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--out", default=None)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--hlo", default=None, help="the profiled step's optimised HLO (text dump)")
    p.add_argument("--steps", type=int, default=3, help="--hlo: steps in the profile")
    args = p.parse_args()
    from jax.profiler import ProfileData
    results = {}
    for path in sorted(glob.glob(os.path.join(args.dir, "**", "*.xplane.pb"), recursive=True)):
        workload = os.path.relpath(path, args.dir).split(os.sep)[0]
        data = ProfileData.from_file(path)  # read once: summarise and phases share it
        results[workload] = summarise(path, data, args.top)
        for plane, s in results[workload]["planes"].items():
            print(f"== {workload} {plane}: kernels {s['kernel_ms']:.1f} ms over modules "
                  f"{s['module_ms']:.1f} ms (busy {s['busy']})")
            for cat, ms in s["categories_ms"].items():
                print(f"   {cat:20s} {ms:9.2f} ms  {ms / s['kernel_ms']:6.1%}")
            for k in s["top_kernels"][:12]:
                print(f"   {k['ms']:9.2f} ms x{k['calls']:<5d} {k['category']:12s} {k['name'][:90]}")
        if args.hlo:
            ph = results[workload]["phases"] = phases(data, args.hlo, args.steps)
            print(f"   per step (span {ph['span_ms_per_step']:.1f} ms):")
            for k, ms in ph["phase_ms_per_step"].items():
                print(f"     {k:28s} {ms:8.2f} ms")
            for k, ms in list(ph["xla_kernel_ms_per_step"].items())[:15]:
                print(f"       {ms:7.2f} ms  {k}")
            for g in ph["gaps_over_1ms"][:5]:
                print(f"     idle {g['ms']:.1f} ms before {g['before']}")
    if not any(r["planes"] for r in results.values()):
        print("no device plane with kernel events in", sorted(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
