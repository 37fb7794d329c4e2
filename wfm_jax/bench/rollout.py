"""wfm_jax rollout: DPM-Solver++(2M) over the SD3 sigma grid as one lax.scan, then VAE decode.

One jitted program per batch: `rollout_steps` transformer calls (guidance 1.0, so no CFG
doubling, as the SD3.5 NFT recipe samples) and the decode to [0, 1] pixels. bf16 weights and
compute for both models (inference), fp32 latents in the sampler.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.mesh import make_mesh, mesh_jit
from wfm_jax.bench import devices, flops, inputs, timing, weights
from wfm_jax.bench.train_step import resolved_attention, xla_plan_bytes
from wfm_jax.models.sd3.pipeline import decode_latents
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import flow_sigmas


def make_rollout(t_graph, v_graph, vae_config: dict, sigmas):
    def rollout(t_state, v_state, noise, prompt_embeds, pooled):
        transformer = nnx.merge(t_graph, t_state)

        def velocity(x, timesteps, cond):
            return transformer(x, cond["prompt_embeds"], cond["pooled_projections"], timesteps)

        out = sample(velocity, noise, sigmas, method="dpm2",
                     cond={"prompt_embeds": prompt_embeds, "pooled_projections": pooled})
        return decode_latents(nnx.merge(v_graph, v_state), vae_config, out.latents)

    return mesh_jit(rollout, mesh=make_mesh(devices=jax.local_devices()[:1]))


def run(suite, options, peak_flops: float | None) -> dict:
    bf16 = jnp.bfloat16
    start = time.perf_counter()
    transformer = weights.jax_module("transformer", suite.transformer, dtype=bf16,
                                     param_dtype=bf16, attention_impl=options.attention_impl)
    attention_impl = resolved_attention(transformer, suite)
    vae = weights.jax_module("vae", suite.vae, dtype=bf16, param_dtype=bf16)
    t_graph, t_state = nnx.split(transformer)
    v_graph, v_state = nnx.split(vae)
    timing.progress(f"rollout/wfm_jax: weights built in {time.perf_counter() - start:.1f} s")
    device = jax.local_devices()[0]
    b = {k: jax.device_put(v, device) for k, v in inputs.rollout_batch(suite).items()}
    args = (t_state, v_state, b["noise"], b["prompt_embeds"].astype(bf16),
            b["pooled_projections"].astype(bf16))
    sigmas, _ = flow_sigmas(suite.rollout_steps, inputs.SHIFT)
    start = time.perf_counter()
    compiled = make_rollout(t_graph, v_graph, suite.vae, jnp.asarray(sigmas)).lower(*args).compile(
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
    lat = suite.latent_size
    f = flops.rollout(suite.transformer, suite.vae, suite.rollout_batch, suite.rollout_steps,
                      lat, lat, suite.text_len)
    return timing.record(
        "wfm_jax", f"wfm_jax sample(method='dpm2') lax.scan + AutoencoderKL.decode, one jit, bf16, "
        f"attention={attention_impl}",
        t, samples=suite.rollout_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.jax_peak_memory(),
        compile_time_s=t["first_call_s"] - t["step_time_s"],
        compile_note="first call (trace + lower + XLA compile + run) minus the steady step",
        extra={"output_mean": float(jnp.mean(outputs[0])), "attention_impl": attention_impl,
               "profile_dir": trace, "xla_memory_plan_bytes": xla_plan_bytes(compiled)})
