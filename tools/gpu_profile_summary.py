"""Where the device time of a profiled step goes: reads the `*.xplane.pb` files that
`python -m wfm_jax.bench --profile DIR` writes (jax.profiler.ProfileData, no TensorBoard
needed) and sums kernel time per category and per kernel on each device plane.

    python tools/gpu_profile_summary.py DIR [--out summary.json] [--top 25]

Categories come from kernel names (cuBLAS/CUTLASS/nvjet GEMMs, cuDNN/flash attention, NCCL,
copies, XLA's own fusions); the figure `busy` is kernel time over the XLA module span, which
says how much of a step the GPU sat idle (host, launch gaps)."""
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


def summarise(path: str, top: int) -> dict:
    from jax.profiler import ProfileData
    data = ProfileData.from_file(path)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--out", default=None)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    results = {}
    for path in sorted(glob.glob(os.path.join(args.dir, "**", "*.xplane.pb"), recursive=True)):
        workload = os.path.relpath(path, args.dir).split(os.sep)[0]
        results[workload] = summarise(path, args.top)
        for plane, s in results[workload]["planes"].items():
            print(f"== {workload} {plane}: kernels {s['kernel_ms']:.1f} ms over modules "
                  f"{s['module_ms']:.1f} ms (busy {s['busy']})")
            for cat, ms in s["categories_ms"].items():
                print(f"   {cat:20s} {ms:9.2f} ms  {ms / s['kernel_ms']:6.1%}")
            for k in s["top_kernels"][:12]:
                print(f"   {k['ms']:9.2f} ms x{k['calls']:<5d} {k['category']:12s} {k['name'][:90]}")
    if not any(r["planes"] for r in results.values()):
        print("no device plane with kernel events in", sorted(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
