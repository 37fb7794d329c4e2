"""The benchmark of any recipe, any family: its own compiled programs timed on this machine's
devices, wfm_jax only (no torch twin is needed, so a family added from outside is benchmarked
with nothing written for it here).

    python -m wfm_jax.bench --recipe configs/X.py [--config.a.b=v ...] [--devices N]
                            [--batch-per-device B] [--repeats 3] [--out results.json]

What runs: programs.build on programs.abstract_setup, the same path the planner compiles and the
trainer runs (SFT: the train step; RL: one rollout chunk and the update), each program compiled
once on the recipe's shapes and called on random arguments of those shapes, drawn afresh before
every call (outside the timing: the programs donate their state). Weights are random, so the
figures are speed, not quality. FLOPs are the compiled program's matmul and convolution FLOPs
(programs.stats: the traced jaxpr, scans counted x their length) over all devices; MFU is
against the device kind's dense bf16 peak (bench/devices.py; on CPU the measured bf16 GEMM rate).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.bench.timing import gib


class RecipeBenchError(ValueError):
    """A recipe the benchmark cannot run (bad devices, a recipe that does not resolve)."""


def random_maker(tree: Any):
    """seed -> arrays of the ShapeDtypeStructs in `tree`, on their shardings, made by one
    compiled program (one per tree, not one per leaf): floats in [0.1, 1) (positive, so sigmas
    and scales stay in range), integers and booleans zero, PRNG keys split from the seed. Leaves
    that are not ShapeDtypeStructs pass through.

    The floats are an integer hash of (seed, leaf, element index), not jax.random: threefry per
    leaf made this program slower to compile than the step it feeds (23 s for a tiny Wan state
    on CPU). Timing needs values that are neither zero nor alike, not a statistical generator."""
    leaves, treedef = jax.tree.flatten(tree)
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]
    specs = [leaves[i] for i in slots]

    def make(seed):
        key = jax.random.key(seed)
        return [_draw(spec, seed, j, key) for j, spec in enumerate(specs)]

    shardings = [getattr(spec, "sharding", None) for spec in specs]
    program = jax.jit(make, out_shardings=shardings)

    def draw(seed: int):
        out = list(leaves)
        for i, arr in zip(slots, program(jnp.uint32(seed)), strict=True):
            out[i] = arr
        return jax.tree.unflatten(treedef, out)
    return draw


def _draw(spec: jax.ShapeDtypeStruct, seed, leaf: int, key):
    shape, dtype = spec.shape, spec.dtype
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        size = int(np.prod(shape))
        key = jax.random.fold_in(key, leaf)
        return jax.random.split(key, max(size, 1))[:size].reshape(shape)
    if jnp.issubdtype(dtype, jnp.floating):
        unit = hash_uniform(shape, seed.astype(jnp.uint32) * np.uint32(0x9E3779B1)
                            + np.uint32((leaf * 0x85EBCA77) & 0xFFFFFFFF))
        return (0.1 + 0.9 * unit).astype(dtype)
    return jnp.zeros(shape, dtype)


def hash_uniform(shape: tuple[int, ...], salt) -> jax.Array:
    """float32 in [0, 1) from a 32-bit mix (murmur3's finaliser) of each element's row-major
    index plus `salt`: a handful of element-wise integer ops, so cheap to compile at any size
    and sharded as the output is (the index is built from per-axis iotas)."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
        index = index + iota * np.uint32(stride & 0xFFFFFFFF)
        stride *= shape[axis]
    h = index + salt
    h = (h ^ (h >> 16)) * np.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * np.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * np.float32(2.0 ** -24)


def time_program(program, repeats: int, warmup: int = 1, name: str = "program") -> dict:
    """Compile `program` on its abstract arguments, then time `repeats` calls on fresh random
    arguments after `warmup` untimed ones: {compile_seconds, step_time_s, step_times_s, flops,
    xla_flops_per_device, xla_memory_plan_bytes, peak_memory_bytes, peak_memory_source}. A
    progress line after the compile and each call (stderr), so a run killed at its time limit
    still says how far it got."""
    from wfm_jax.bench.devices import jax_peak_memory
    from wfm_jax.bench.jax_side import xla_plan_bytes
    from wfm_jax.bench.timing import progress
    from wfm_jax.core import mesh as wmesh
    from wfm_jax.programs.stats import count_jaxpr_flops
    abstract = program.abstract_args()
    fn = program.fn
    progress(f"{name}: compiling")
    with jax.set_mesh(fn.mesh), wmesh.use_rules(fn.rules):
        traced = fn.jitted.trace(*abstract)
        start = time.perf_counter()
        compiled = traced.lower().compile()
        compile_s = time.perf_counter() - start
    plan_bytes = xla_plan_bytes(compiled)
    progress(f"{name}: compiled in {compile_s:.1f} s"
             + (f", XLA plans {gib(plan_bytes)} GiB a device" if plan_bytes else ""))
    flops = float(count_jaxpr_flops(traced.jaxpr))
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    draw = random_maker(abstract)
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        args = draw(i)
        jax.block_until_ready(args)
        if i == 0:
            progress(f"{name}: FLOPs counted; random arguments drawn in "
                     f"{time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
        progress(f"{name}: call {i + 1} of {warmup + repeats} "
                 f"({'timed' if i >= warmup else 'warm-up'}) {elapsed * 1e3:.1f} ms")
        del args
    peak_bytes, peak_source = jax_peak_memory()
    # the record is written once every program has run: this line keeps the figures of a run
    # cut short by its time limit (as on a lent GPU)
    progress(f"{name}: median {statistics.median(times) * 1e3:.1f} ms, peak {gib(peak_bytes)}"
             + (" GiB" if peak_bytes is not None else ""))
    return {"compile_seconds": round(compile_s, 2), "step_time_s": statistics.median(times),
            "step_times_s": times, "flops": flops, "xla_memory_plan_bytes": plan_bytes,
            "peak_memory_bytes": peak_bytes, "peak_memory_source": peak_source,
            # XLA's count, element-wise work included, per device (a loop body counted once)
            "xla_flops_per_device": float(cost.get("flops", 0.0))}


def run(config, *, devices: int | None, batch_per_device: int, repeats: int, warmup: int = 1,
        peak: dict | None = None) -> dict:
    """The record of every program of the recipe's run, timed on the first `devices` devices."""
    from wfm_jax.algorithms.base import AlgorithmConfigError
    from wfm_jax.algorithms.registry import algorithm_named
    from wfm_jax.core import mesh as wmesh
    from wfm_jax.programs import abstract_setup, build
    from wfm_jax.programs import setup as setup_lib

    available = jax.devices()
    n = devices or len(available)
    if n > len(available):
        raise RecipeBenchError(f"{n} devices asked, this backend has {len(available)}")
    try:
        mesh = wmesh.make_mesh(config.policy.parallelism, devices=available[:n])
    except ValueError as e:
        raise RecipeBenchError(f"policy.parallelism does not fit {n} devices: {e} (override, e.g. "
                               f"--config.policy.parallelism.fsdp=-1)") from None
    rules = wmesh.active_rules()
    setup_lib.ensure_tiny_assets(config)
    kind = str(config.train.train_policy.type)
    d = config.policy.diffusers
    size, frames = tuple(int(v) for v in d.inference_size), int(d.train_frames)
    algo_cls = algo_config = None
    if kind != "sft":
        try:
            algo_cls = algorithm_named(kind)
            algo_config = algo_cls.Config.from_recipe(config)
        except AlgorithmConfigError as e:
            raise RecipeBenchError(str(e)) from None
    aux_fn = algo_cls.aux_fn(algo_config, bool(config.policy.lora.enable)) if algo_cls else None
    setup = abstract_setup(config, mesh, rules, config.policy.remat, bool(config.policy.scan_layers),
                           aux_fn=aux_fn)
    if algo_cls is None:
        context = mesh.shape["context"]
        batch = batch_per_device * mesh.devices.size // context
        programs = build(setup, batch=batch, size=size, frames=frames)
        todo = {"sft_step": (programs.sft_step, batch)}
    else:
        batch = int(config.train.train_batch_per_replica)
        programs = build(setup, algo_cls(algo_config, setup.pipe.shell()), size=size, frames=frames)
        todo = {"rollout": (programs.rollout, programs.layout.rollout_chunk),
                "update": (programs.update, batch)}
    records = {}
    for name, (program, samples) in todo.items():
        rec = time_program(program, repeats, warmup, name)
        rec["samples_per_call"] = int(samples)
        rec["samples_per_s"] = samples / rec["step_time_s"]
        rec["tflops_per_s"] = rec["flops"] / rec["step_time_s"] / 1e12
        peak_flops = (peak or {}).get("peak_flops")
        rec["mfu"] = (rec["flops"] / rec["step_time_s"] / (peak_flops * n)) if peak_flops else None
        records[name] = rec
    return {"family": str(config.policy.family), "algorithm": kind, "devices": n,
            "mesh": {k: int(v) for k, v in mesh.shape.items()}, "size": list(size),
            "frames": frames if setup.pipe.is_video else None, "repeats": repeats,
            "warmup": warmup, "peak": peak, "programs": records}


def markdown(result: dict) -> str:
    head = (f"Recipe `{result['config']}`: {result['family']} / {result['algorithm']} on "
            f"{result['devices']} {result['device_kind']} device(s), mesh {result['mesh']}; "
            f"median of {result['repeats']} calls after {result['warmup']} warm-up, random "
            f"weights and inputs.\n\n")
    rows = ["| program | step (ms) | samples/s | TFLOP/call | TFLOP/s | MFU | peak (GiB) | "
            "compile (s) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in result["programs"].items():
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        rows.append(f"| {name} | {r['step_time_s'] * 1e3:.1f} | {r['samples_per_s']:.2f} | "
                    f"{r['flops'] / 1e12:.4g} | {r['tflops_per_s']:.4g} | {mfu} | "
                    f"{gib(r.get('peak_memory_bytes'))} | {r['compile_seconds']} |")
    return head + "\n".join(rows) + "\n"

