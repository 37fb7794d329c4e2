"""XLA's per-device memory of the suite's train steps at their real shape, compiled (never run)
on an N-device fsdp mesh of simulated CPU devices with abstract weights.

    python -m wfm_jax.bench --suite cosmos_gpu --xla-memory [--xla-devices 8] [--remat full]

The step compiled is the bench's own (train_step.step_fn: noise mix -> the family's forward ->
flow-matching loss -> grads -> clip -> AdamW, params and optimizer state donated) with the
transformer built by its converter registry entry under nnx.eval_shape: ShapeDtypeStructs
carrying the mesh shardings the trainer gives them (wfm_jax.core.mesh.param_shardings; optimizer
leaves like their params), the batch split over (data, fsdp), `train_batch` rows per device.
wfm_jax.plan compiles the trainer's own steps (SFT, and RL's rollout and update) for every
family; this compiles the bench's step, so the memory sits beside the bench's timings (plan's
abstract placement and per-device byte count are reused). CPU keeps bf16 work in fp32 and has no flash kernel ("auto"
attention is the blockwise kernel at these lengths): the figures are above a GPU's.
"""
from __future__ import annotations

import dataclasses
import time

GiB = 2 ** 30


def _abstract_model(suite, mode: str, options, scan: bool):
    import jax.numpy as jnp
    from flax import nnx

    from converters.registry import spec_for
    from wfm_jax.models.lora import attach_lora
    wl = suite.workload
    spec = spec_for(dict(suite.transformer, _class_name=wl.transformer_class))
    lora = mode == "lora"

    def make():
        m = spec.make_model(suite.transformer, dtype=jnp.bfloat16,
                            param_dtype=jnp.bfloat16 if lora else jnp.float32, rngs=nnx.Rngs(0),
                            attention_impl=options.attention_impl, remat=options.remat,
                            scan_layers=scan)
        if lora:
            attach_lora(m, wl.lora_targets, suite.lora_rank, suite.lora_alpha)
        return m
    return nnx.eval_shape(make)


def compile_step(suite, mode: str, options, *, devices: int = 8, scan: bool = True) -> dict:
    """Compile one train step of `mode` ("full" | "lora"); XLA's memory analysis per device."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from wfm_jax.core import mesh as wmesh
    from wfm_jax.bench.train_step import TRAINABLE_FULL, optimizer, resolved_attention, step_fn
    from wfm_jax.programs.abstract import with_shardings
    from wfm_jax.programs.setup import batch_sharding, replicated
    from wfm_jax.programs.stats import per_device_bytes

    if len(jax.devices()) < devices:
        raise ValueError(f"--xla-memory needs {devices} devices, the backend has "
                         f"{len(jax.devices())} (run it as a fresh `python -m wfm_jax.bench`)")
    mesh = wmesh.make_mesh(fsdp=devices, devices=jax.devices()[:devices])
    rules = wmesh.active_rules()
    model = _abstract_model(suite, mode, options, scan)
    attention_impl = resolved_attention(model, suite)
    shardings = wmesh.param_shardings(model, mesh, rules, filter=nnx.Variable)
    wrt = nnx.LoRAParam if mode == "lora" else TRAINABLE_FULL
    graphdef, params, rest = nnx.split(model, wrt, ...)

    params, rest = with_shardings(params, shardings), with_shardings(rest, shardings)
    tx = optimizer(mode)
    opt_abs = jax.eval_shape(tx.init, params)
    rep = replicated(mesh)
    param_sh = jax.tree.map(lambda x: x.sharding, params)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, opt_abs, param_sh,
                                   transform_non_params=lambda _: rep,
                                   is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
    opt_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             opt_abs, opt_sh)
    rows = batch_sharding(mesh, rules)
    global_suite = dataclasses.replace(suite, train_batch=suite.train_batch * devices)
    shapes = jax.eval_shape(lambda: {k: jnp.asarray(v) for k, v in
                                     _shape_only_batch(global_suite).items()})
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rows) for k, v in shapes.items()}
    step = wmesh.mesh_jit(step_fn(graphdef, tx, suite), mesh=mesh, donate_argnums=(0, 1))
    start = time.perf_counter()
    lowered = step.lower(params, opt_state, rest, batch)
    compiled = lowered.compile(compiler_options=suite.compiler_options)
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    return {"mode": mode, "devices": devices, "mesh": {k: int(v) for k, v in mesh.shape.items()},
            "global_batch": global_suite.train_batch, "remat": options.remat,
            "scan_layers": scan, "attention_impl": attention_impl,
            "compile_seconds": round(seconds, 1),
            "params_bytes": per_device_bytes(params),
            "optimizer_bytes": per_device_bytes(opt_state),
            "frozen_bytes": per_device_bytes(rest),
            "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes),
            "alias_bytes": int(m.alias_size_in_bytes),
            "temp_bytes": int(m.temp_size_in_bytes),
            "peak_bytes": int(getattr(m, "peak_memory_in_bytes", 0)) or None,
            "plan_bytes": int(m.argument_size_in_bytes + m.output_size_in_bytes
                              + m.temp_size_in_bytes - m.alias_size_in_bytes),
            "note": "per device, XLA CPU compile (bf16 work kept in fp32, no flash kernel): "
                    "above a GPU's"}


def _shape_only_batch(suite) -> dict:
    """The train batch's shapes and dtypes without drawing it (the real shape's text input alone
    is 1.6 GB at 8 rows)."""
    import numpy as np
    wl = suite.workload
    b = suite.train_batch
    lat = wl.latent_shape(suite, b)

    class _Zeros:  # stands in for the rng: text_inputs only asks it for arrays of a shape
        @staticmethod
        def standard_normal(shape, dtype=np.float32):
            return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape,
                                                   (0,) * len(shape))
    return {"x0": np.broadcast_to(np.float32(0), lat), "noise": np.broadcast_to(np.float32(0), lat),
            "sigmas": np.zeros(b, np.float32), "timesteps": np.zeros(b, np.float32),
            **wl.text_inputs(suite, b, _Zeros())}


def run(suite, options, devices: int = 8) -> dict:
    """Full and LoRA steps, each compiled once; a failure is recorded, not raised."""
    from wfm_jax.bench import timing
    out = {}
    for mode in ("full", "lora"):
        timing.progress(f"xla_memory/train_{mode}: compiling on {devices} CPU devices")
        try:
            out[f"train_{mode}"] = compile_step(suite, mode, options, devices=devices)
        except Exception as e:  # noqa: BLE001 -- recorded in the JSON
            out[f"train_{mode}"] = {"mode": mode, "error": f"{type(e).__name__}: {e}"[:500]}
        rec = out[f"train_{mode}"]
        timing.progress(f"xla_memory/train_{mode}: {rec.get('error') or describe(rec)}")
    return out


def describe(rec: dict) -> str:
    g = lambda k: f"{rec[k] / GiB:.2f}" if rec.get(k) is not None else "n/a"  # noqa: E731
    return (f"arguments {g('argument_bytes')} GiB, temp {g('temp_bytes')} GiB, peak "
            f"{g('peak_bytes')} GiB per device (compiled in {rec['compile_seconds']} s)")


def markdown(result: dict) -> str:
    mem = result["xla_memory"]
    first = next((r for r in mem.values() if "error" not in r), {})
    lines = [f"Suite `{result['suite']}`: train steps compiled (not run) by XLA on "
             f"{first.get('devices', '?')} simulated CPU devices, mesh {first.get('mesh')}, "
             f"global batch {first.get('global_batch')}, remat {first.get('remat')}, scan_layers "
             f"{first.get('scan_layers')}, attention {first.get('attention_impl')}. Per device, "
             "GiB. CPU keeps bf16 work in fp32 and has no flash kernel: above a GPU's.", "",
             "| step | params | optimizer | frozen | arguments | outputs | aliased | temp | "
             "arguments + outputs + temp - aliased | XLA peak | compile (s) |", "|" + "---|" * 11]
    for name, r in mem.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} |" + " |" * 9)
            continue
        cells = [f"{r[k] / GiB:.2f}" if r.get(k) is not None else "n/a" for k in
                 ("params_bytes", "optimizer_bytes", "frozen_bytes", "argument_bytes",
                  "output_bytes", "alias_bytes", "temp_bytes", "plan_bytes", "peak_bytes")]
        lines.append("| " + " | ".join([name, *cells, str(r["compile_seconds"])]) + " |")
    return "\n".join(lines) + "\n"
