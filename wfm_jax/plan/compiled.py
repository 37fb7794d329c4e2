"""What the planner does with a compiled program, for every family (report.py: the DiT recipes;
vlm.py: the vision-language SFT step): compile it or take the compiler's refusal as a result, its
peak per device, the memory limit of the verdict, the report's common tail, and a program at full
depth scaled from two compiles of fewer blocks (report's --layers, vlm's --vision-blocks)."""
from __future__ import annotations

from wfm_jax.plan import topology
from wfm_jax.plan.args import DEVICE_MEMORY, GiB


def finish(out: dict, compiled: dict, step: dict, topo, config) -> dict:
    """The report's common tail (every family): the topology's fields per program, the train
    step's figures at the top level, the peak program and the fit verdict."""
    if topo is not None:
        out.update({k: topo[k] for k in ("topology", "num_slices", "chips", "chip",
                                         "peak_flops_per_device", "peak_table")})
        out["device_kind"] = topo["device_kind"]  # libtpu's name; chip: the table's
        out["hbm_bytes"] = out["device_memory_bytes"]  # the chip's share, or --hbm-gib
        out["attention_impl"] = config.policy.attention_impl
        out["estimate_method"] = topology.ESTIMATE_METHOD
        out["estimate_methods"] = topology.METHODS  # what each program's estimate_method means
        for p in compiled.values():
            topology.program_fields(p, dict(topo, hbm_bytes=out["hbm_bytes"]),
                                    out["devices"], config.policy.attention_impl)
    out["programs"] = compiled
    # the train step's figures at the top level (RL: the update), as SFT always had them
    for k in ("argument", "temp", "output", "alias"):
        out[f"step_{k}_bytes"] = step.get(f"{k}_bytes")
    out["compile_seconds"] = round(sum(p["compile_seconds"] for p in compiled.values()), 1)
    out["flops_per_step"] = step.get("flops")
    out["xla_flops_per_device"] = step.get("xla_flops_per_device")
    out["collective_bytes"] = step.get("collective_bytes")
    peaks = {k: p["peak_bytes"] for k, p in compiled.items() if p["peak_bytes"] is not None}
    out["peak_program"] = max(peaks, key=peaks.get) if peaks else None
    out["total_bytes"] = peaks.get(out["peak_program"])
    # a program the compiler refused for memory does not fit, whatever the others need
    out["fits"] = (all(p["compiled"] or p["fits"] is not False for p in compiled.values())
                   and bool(peaks) and out["total_bytes"] <= out["device_memory_bytes"])
    out["failed_programs"] = [k for k, p in compiled.items() if not p["compiled"]]
    return out


def plan_mesh(args, config):
    """(mesh, topology or None): the recipe's policy.parallelism on the --topology's devices or
    the first --devices of this backend; a count or layout that cannot be made is one line."""
    import jax

    from wfm_jax.core import mesh as wmesh
    topo = None
    if getattr(args, "topology", None):
        devices, topo = topology.topology_devices(args.topology, args.num_slices)
        where = f"the {len(devices)} devices of {args.topology}"
    else:
        if len(jax.devices()) < args.devices:
            raise SystemExit(f"wfm_jax.plan: {args.devices} devices asked, the backend has "
                             f"{len(jax.devices())} (run it as a fresh process: python -m "
                             f"wfm_jax.plan)")
        devices, where = jax.devices()[:args.devices], f"{args.devices} devices"
    try:
        mesh = wmesh.make_mesh(config.policy.parallelism, devices=devices)
    except ValueError as e:
        sizes = {k: int(v) for k, v in dict(config.policy.parallelism).items()}
        raise SystemExit(f"wfm_jax.plan: policy.parallelism {sizes} does not fit {where}: {e} "
                         f"(override, e.g. --config.policy.parallelism.fsdp=-1 "
                         f"--config.policy.parallelism.data=1)") from e
    return mesh, topo


def memory_limit(args, topo) -> float:
    """Per-device memory the fit verdict uses: --hbm-gib, else the topology's chip share, else
    the --device-kind's."""
    if getattr(args, "hbm_gib", None):
        return args.hbm_gib * GiB
    return topo["hbm_bytes"] if topo else DEVICE_MEMORY[args.device_kind]


def compile_program(program, progress: bool, hlo_dir: str | None = None, cache=None) -> dict:
    """program's compile_lowered() result, or, when the compiler refuses it (on TPU:
    RESOURCE_EXHAUSTED when its temporaries exceed HBM), the failure as a result, so the plan
    goes on to the next program.
    progress: a line on stderr per program (a TPU compile of a large model takes minutes).
    hlo_dir: where a TPU compile's optimized HLO is written, as <program>[_<n>].hlo.txt (always
    compiled then: a cached result has no HLO text).
    cache: a plan.stats_cache.StatsCache; a hit is the stored result with "cached": True (its
    compile_seconds: the compile that produced it), and nothing is compiled."""
    import time

    import jax

    from wfm_jax.programs.stats import compile_lowered, per_device_bytes
    start = time.perf_counter()
    mesh = getattr(program, "mesh", None)
    keep = None
    if hlo_dir:
        import os
        os.makedirs(hlo_dir, exist_ok=True)
        keep, n = os.path.join(hlo_dir, f"{program.name}.hlo.txt"), 1
        while os.path.exists(keep):  # the cut models' compiles of one program: each its own
            keep, n = os.path.join(hlo_dir, f"{program.name}_{n}.hlo.txt"), n + 1
    reader = topology.hlo_reader(mesh.devices.flat[0], keep) if mesh is not None else None
    key = None
    try:  # on a TPU topology the HLO's loops are read as it compiles (topology.estimate)
        lowering = program.lowering()
        if cache is not None:
            key = cache.key(lowering, reader is not None)
            hit = None if keep else cache.get(key)
            if hit is not None:
                progress and say(f"wfm_jax.plan: {program.name}: from the plan cache "
                                 f"({cache.directory}; its compile took {hit['compile_seconds']} s)")
                return dict(hit, cached=True)
        p = dict(compile_lowered(lowering, reader))
    except jax.errors.JaxRuntimeError as e:
        p = topology.compile_failure(e)
        progress and say(f"wfm_jax.plan: {program.name}: not compiled after "
            f"{time.perf_counter() - start:.0f} s: {p['error']}")
        p.update({"compile_seconds": round(time.perf_counter() - start, 1),
                  "argument_bytes": per_device_bytes(program.abstract_args()),
                  "temp_bytes": p.get("required_bytes"), "output_bytes": None,
                  "alias_bytes": None, "generated_code_bytes": None, "flops": None,
                  "xla_flops_per_device": None, "collective_bytes": None})
        # a refusal for memory is the compiler's verdict on this program: kept; other errors not
        return _stored(cache if p["fits"] is False else None, key, p)
    p["compiled"] = True
    if progress:
        say(f"wfm_jax.plan: {program.name}: compiled in {p['compile_seconds']} s: temp "
            f"{p['temp_bytes']}, argument {p['argument_bytes']}, output {p['output_bytes']}, "
            f"alias {p['alias_bytes']} bytes per device, {p['flops']:.4g} FLOP, XLA "
            f"{p['xla_flops_per_device']:.4g} FLOP/device, optimal_seconds "
            f"{p['optimal_seconds']:.4g}"
            + (f" (loop bodies once; x{p['hlo']['loop_factor']:.3g} with their trips)"
               if p.get("hlo", {}).get("loop_factor") else "")
            + f", kernels {p['custom_calls']}")
    return _stored(cache, key, p)


def _stored(cache, key: str | None, p: dict) -> dict:
    p["cached"] = False
    if cache is not None and key is not None:
        cache.put(key, {k: v for k, v in p.items() if k != "cached"})
    return p


def say(line: str) -> None:
    import sys
    print(line, file=sys.stderr, flush=True)


def peak(p: dict, resident: int, code_in_hbm: bool) -> None:
    """p's peak per device: what stays resident + its temporaries + outputs not written over
    donated inputs (+ the executable, which a TPU holds in HBM); None when it did not compile."""
    if not p["compiled"]:
        p["peak_bytes"] = None
        return
    p["peak_bytes"] = (resident + p["temp_bytes"] + p["output_bytes"] - p["alias_bytes"]
                       + (p["generated_code_bytes"] if code_in_hbm else 0))


_SUMMED = ("argument_bytes", "output_bytes", "alias_bytes", "generated_code_bytes", "flops",
           "xla_flops_per_device", "optimal_seconds", "xla_bytes_accessed", "compile_seconds")


def join_tail(body: dict, tail: dict, handoff_bytes: int) -> dict:
    """The figures of one program that runs `body` and then `tail` on its output (the sampler or
    rollout, then its VAE decode) from their two compiles (compile_program's results).
    handoff_bytes: per device, what the body hands the tail (the latents), an output of the
    whole that the tail takes as an argument. Summed: arguments (less the handoff), outputs,
    code, FLOPs, cost-model seconds, collectives, kernels; temporaries: the larger, as the
    body's are dead when the tail runs and both programs' outputs are outputs of the whole.
    The HLO's loop factor is the cost-weighted one of both; its breakdown is the body's.
    A refused compile makes the whole refused (its figures, the tail's temporaries if both)."""
    if not (body["compiled"] and tail["compiled"]):
        failed = dict(body if not body["compiled"] else tail)
        failed["compile_seconds"] = round(body["compile_seconds"] + tail["compile_seconds"], 1)
        return failed
    out = dict(body)
    for key in _SUMMED:
        out[key] = body[key] + tail[key]
    out["argument_bytes"] -= handoff_bytes
    out["compile_seconds"] = round(out["compile_seconds"], 1)
    out["temp_bytes"] = max(body["temp_bytes"], tail["temp_bytes"])
    out["collective_bytes"] = {k: v + tail["collective_bytes"].get(k, 0)
                               for k, v in body["collective_bytes"].items()}
    out["custom_calls"] = {k: v + tail["custom_calls"].get(k, 0)
                           for k, v in body["custom_calls"].items()}
    hb, ht = body.get("hlo"), tail.get("hlo")
    if hb and ht and hb.get("loop_factor") and ht.get("loop_factor"):
        sb, st = body["optimal_seconds"], tail["optimal_seconds"]
        rb, rt = hb["roofline_seconds_once"], ht["roofline_seconds_once"]

        def loops(h, weight):  # each loop's share of the joined roofline's loop-once time
            return [dict(x, share=x["share"] * weight) for x in h.get("loops", [])]
        out["hlo"] = dict(
            hb, loop_factor=(sb * hb["loop_factor"] + st * ht["loop_factor"]) / (sb + st)
            if sb + st > 0 else 1.0,
            loops=loops(hb, rb / (rb + rt)) + loops(ht, rt / (rb + rt)) if rb + rt > 0 else [],
            unknown_loops=hb["unknown_loops"] + ht["unknown_loops"],
            **{k: hb[k] + ht[k] for k in (
                "roofline_seconds_once", "roofline_seconds", "flops_once", "flops",
                "kernel_flops", "kernel_seconds", "undeclared_kernels")})
    return out


# what scale_linear extrapolates: bytes per device (int) and XLA / jaxpr figures (float)
_LINEAR_BYTES = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                 "generated_code_bytes")
_LINEAR_FLOATS = ("flops", "xla_flops_per_device", "optimal_seconds", "xla_bytes_accessed")
# what scaled_from keeps of each compile (estimate() reads flops, xla flops, optimal_seconds and
# the HLO's loops)
_MEASURED = ("compiled", *_LINEAR_BYTES, *_LINEAR_FLOATS, "compile_seconds", "error",
             "required_bytes", "hlo")


def scale_linear(measured: list[dict], depths: tuple[int, int], full: int, unit: str,
                 method: str) -> dict:
    """A program at `full` blocks from its compiles (compile_program's results) at depths
    (a, b): bytes, FLOPs and collectives extrapolated linearly, full = m_a + (m_b - m_a) x
    scale_factor with scale_factor = (full - a) / (b - a); `scaled_from`: the two compiles
    (keyed by `unit`, e.g. "layers"), `scale_method`: `method`. The cost model's seconds are
    scaled per compile, loop-corrected, in topology.estimate. A compile the compiler refused
    makes the result refused (the smaller model's refusal first); for an out-of-memory refusal
    the temporaries it asked for are extrapolated the same way."""
    (da, db), (a, b) = depths, measured
    x = (full - da) / (db - da)
    out = dict(b if a["compiled"] else a)
    both = a["compiled"] and b["compiled"]
    keys = (*_LINEAR_BYTES, *_LINEAR_FLOATS) if both else ("argument_bytes", "temp_bytes")
    for key in keys:
        va, vb = a.get(key), b.get(key)
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            v = va + (vb - va) * x
            out[key] = round(v) if key.endswith("_bytes") else v
    if both:
        ca, cb = a["collective_bytes"], b["collective_bytes"]
        out["collective_bytes"] = {k: round(ca.get(k, 0) + (v - ca.get(k, 0)) * x)
                                   for k, v in cb.items()}
    elif out.get("required_bytes") is not None:  # out of memory: what the full model asks for
        out["required_bytes"] = out["temp_bytes"]
    out["compile_seconds"] = round(a["compile_seconds"] + b["compile_seconds"], 1)
    out.pop("hlo", None)  # each compile's loops: in scaled_from
    out["scaled_from"] = [{unit: d, **{f: m.get(f) for f in _MEASURED}}
                          for d, m in zip(depths, measured)]
    out["scale_factor"] = x
    out["scale_method"] = method
    return out
