"""XLA's per-device memory of the suite's train steps at their real shape, compiled (never run)
on an N-device fsdp mesh of simulated CPU devices with abstract weights.

    python -m wfm_jax.bench --suite cosmos_gpu --xla-memory [--xla-devices 8] [--remat full]

The step compiled is the trainer's own (programs.build(setup).sft_step, as the timed workloads
run it: noise and sigma draws -> the family's forward -> flow-matching loss -> grads -> clip ->
AdamW, the state donated) on programs.abstract_setup with the suite's component configs and
the recipe jax_side.bench_recipe gives the workload: ShapeDtypeStructs carrying the mesh
shardings the trainer gives them (wfm_jax.core.mesh.param_shardings; optimizer leaves like
their params), the batch split over (data, fsdp), `train_batch` rows per device. wfm_jax.plan
compiles the same programs for a recipe. CPU keeps bf16 work in fp32 and has no flash kernel
("auto" attention is the blockwise kernel at these lengths): the figures are above a GPU's.
"""
from __future__ import annotations

import dataclasses
import time

from wfm_jax.bench.timing import gib


def compile_step(suite, mode: str, options, *, devices: int = 8, scan: bool = True) -> dict:
    """Compile one train step of `mode` ("full" | "lora"); XLA's memory analysis per device."""
    import jax
    import jax.numpy as jnp

    from wfm_jax.bench.jax_side import bench_recipe, resolved_attention
    from wfm_jax.core import mesh as wmesh
    from wfm_jax.programs import abstract_setup, build
    from wfm_jax.programs.stats import per_device_bytes

    if len(jax.devices()) < devices:
        raise ValueError(f"--xla-memory needs {devices} devices, the backend has "
                         f"{len(jax.devices())} (run it as a fresh `python -m wfm_jax.bench`)")
    mesh = wmesh.make_mesh(fsdp=devices, devices=jax.devices()[:devices])
    rules = wmesh.active_rules()
    wl = suite.workload
    global_suite = dataclasses.replace(suite, train_batch=suite.train_batch * devices)
    config = bench_recipe(global_suite, mode, options)
    pipe = wl.pipeline(suite)
    configs = {"transformer": pipe.transformer_config, "vae": pipe.vae_config,
               "scheduler": pipe.scheduler_config, "text_encoders": []}
    setup = abstract_setup(config, mesh, rules, options.remat, scan, configs=configs)
    attention_impl = resolved_attention(_one_layer_model(suite, options, scan), suite)
    rows = setup.batch_sharding()
    shapes = jax.eval_shape(lambda: {k: jnp.asarray(v) for k, v in
                                     _shape_only_batch(global_suite).items()})
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rows) for k, v in shapes.items()}
    cond = {k: v for k, v in batch.items() if k not in ("x0", "ids")}
    step = build(setup).sft_step
    start = time.perf_counter()
    lowered = step.lower(setup.state, setup.frozen, batch["x0"], cond, batch["ids"])
    compiled = lowered.compile(compiler_options=suite.compiler_options)
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    return {"mode": mode, "devices": devices, "mesh": {k: int(v) for k, v in mesh.shape.items()},
            "global_batch": global_suite.train_batch, "remat": options.remat,
            "scan_layers": scan, "attention_impl": attention_impl,
            "compile_seconds": round(seconds, 1),
            "params_bytes": per_device_bytes(setup.state.params),
            "optimizer_bytes": per_device_bytes(setup.state.opt_state),
            "frozen_bytes": per_device_bytes(setup.frozen),
            "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes),
            "alias_bytes": int(m.alias_size_in_bytes),
            "temp_bytes": int(m.temp_size_in_bytes),
            "peak_bytes": int(getattr(m, "peak_memory_in_bytes", 0)) or None,
            "plan_bytes": int(m.argument_size_in_bytes + m.output_size_in_bytes
                              + m.temp_size_in_bytes - m.alias_size_in_bytes),
            "note": "per device, XLA CPU compile (bf16 work kept in fp32, no flash kernel): "
                    "above a GPU's"}


def _one_layer_model(suite, options, scan: bool):
    """The suite's transformer, abstract (its attention layers say which kernel "auto" runs)."""
    import jax.numpy as jnp
    from flax import nnx

    from converters.registry import spec_for
    from wfm_jax.core.abstract import abstract_module
    wl = suite.workload
    spec = spec_for(dict(suite.transformer, _class_name=wl.transformer_class))
    return abstract_module(lambda: spec.make_model(
        suite.transformer, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0),
        attention_impl=options.attention_impl, remat=options.remat, scan_layers=scan))


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
    return {"x0": np.broadcast_to(np.float32(0), lat), "ids": np.zeros(b, np.int32),
            **wl.text_inputs(suite, b, _Zeros())}


def run(suite, options, devices: int = 8) -> dict:
    """Full and LoRA steps, each compiled once; a failure is recorded, not raised."""
    from wfm_jax.bench import timing
    out = {}
    for mode in ("full", "lora"):
        timing.progress(f"xla_memory/train_{mode}: compiling on {devices} CPU devices")
        try:
            out[f"train_{mode}"] = compile_step(suite, mode, options, devices=devices)
        except Exception as e:
            out[f"train_{mode}"] = {"mode": mode, "error": f"{type(e).__name__}: {e}"[:500]}
        rec = out[f"train_{mode}"]
        timing.progress(f"xla_memory/train_{mode}: {rec.get('error') or describe(rec)}")
    return out


def describe(rec: dict) -> str:
    g = lambda k: gib(rec.get(k))
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
        cells = [gib(r.get(k)) for k in
                 ("params_bytes", "optimizer_bytes", "frozen_bytes", "argument_bytes",
                  "output_bytes", "alias_bytes", "temp_bytes", "plan_bytes", "peak_bytes")]
        lines.append("| " + " | ".join([name, *cells, str(r["compile_seconds"])]) + " |")
    return "\n".join(lines) + "\n"
