"""wfm_jax rollout: DPM-Solver++(2M) over the family's sigma grid as one lax.scan, then the VAE
decode (SD3: the SD3 flow grid and AutoencoderKL; Cosmos: its Karras flow sigmas and the Wan VAE).

One jitted program per batch: `rollout_steps` transformer calls (guidance 1.0, so no CFG
doubling, as the SD3.5 and Cosmos NFT recipes sample) and the decode to [0, 1] pixels. bf16
transformer weights and compute, fp32 latents in the sampler; the VAE in bf16 (SD3) or fp32
(Cosmos, as its pipeline).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.bench import devices, inputs, timing, weights
from wfm_jax.bench.jax_side import resolved_attention, xla_plan_bytes
from wfm_jax.core.mesh import make_mesh, mesh_jit
from wfm_jax.sampling.samplers import sample


def make_rollout(t_graph, v_graph, suite, sigmas):
    wl = suite.workload

    def rollout(t_state, v_state, noise, text):
        velocity = wl.jax_rollout_velocity(nnx.merge(t_graph, t_state), suite)
        out = sample(velocity, noise, sigmas, method="dpm2", cond=text)
        return wl.jax_decode(nnx.merge(v_graph, v_state), suite, out.latents)

    return mesh_jit(rollout, mesh=make_mesh(devices=jax.local_devices()[:1]))


def run(suite, options, peak_flops: float | None) -> dict:
    bf16 = jnp.bfloat16
    wl = suite.workload
    start = time.perf_counter()
    transformer = weights.jax_module(wl.transformer_class, suite.transformer, dtype=bf16,
                                     param_dtype=bf16, attention_impl=options.attention_impl)
    attention_impl = resolved_attention(transformer, suite)
    vae_dtype = jnp.float32 if wl.vae_fp32 else bf16
    vae = weights.jax_module(wl.vae_class, suite.vae, dtype=vae_dtype, param_dtype=vae_dtype)
    t_graph, t_state = nnx.split(transformer)
    v_graph, v_state = nnx.split(vae)
    timing.progress(f"rollout/wfm_jax: weights built in {time.perf_counter() - start:.1f} s")
    device = jax.local_devices()[0]
    b = {k: jax.device_put(v, device) for k, v in inputs.rollout_batch(suite).items()}
    text = {k: v.astype(bf16) for k, v in b.items() if k != "noise"}
    args = (t_state, v_state, b["noise"], text)
    sigmas = wl.rollout_sigmas(suite)
    start = time.perf_counter()
    compiled = make_rollout(t_graph, v_graph, suite, jnp.asarray(sigmas)).lower(*args).compile(
        compiler_options=suite.compiler_options)
    compile_s = time.perf_counter() - start
    timing.progress(f"rollout/wfm_jax: compiled in {compile_s:.1f} s")
    outputs = []

    def call():
        image = compiled(*args)
        outputs.append(image)
        return image

    t = timing.time_calls(call, jax.block_until_ready, warmup=suite.warmup, repeats=suite.repeats)
    t["first_call_s"] += compile_s
    trace = timing.profile_calls(call, jax.block_until_ready, options.profile, "rollout")
    f = wl.rollout_flops(suite)
    return timing.record(
        "wfm_jax", f"wfm_jax sample(method='dpm2') lax.scan ({wl.sampler_name}) + "
        f"{wl.vae_class}.decode, one jit, bf16{' (VAE fp32)' if wl.vae_fp32 else ''}, "
        f"attention={attention_impl}",
        t, samples=suite.rollout_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.jax_peak_memory(),
        compile_time_s=t["first_call_s"] - t["step_time_s"],
        compile_note="first call (trace + lower + XLA compile + run) minus the steady step",
        extra={"output_mean": float(jnp.mean(outputs[0])), "attention_impl": attention_impl,
               "profile_dir": trace, "xla_memory_plan_bytes": xla_plan_bytes(compiled)})
