"""wfm_jax train steps: full fine-tune and LoRA of the suite's transformer (SD3 MMDiT, Cosmos DiT:
bench/families.py), flow-matching loss, AdamW.

One jitted step = noise mix -> transformer forward (bf16 compute) -> loss -> grads -> global-norm
clip -> AdamW, with params and optimizer state donated, as the SFT trainer runs it. Full: fp32
master weights, every Param but the position-table Buffer trained. LoRA: frozen bf16 base, fp32
adapters (the SD3.5 NFT recipe's "bf16 params").
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.algorithms.sft import flow_matching_loss, noisy_latents
from wfm_jax.bench import devices, inputs, timing, weights
from wfm_jax.bench.suites import OPTIM
from wfm_jax.core.mesh import make_mesh, mesh_jit
from wfm_jax.core.tree import path_str
from wfm_jax.models.layers.attention import resolve_attention_impl
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.models.lora import attach_lora, find_targets
from wfm_jax.programs.optim import apply_gradients, make_optimizer

TRAINABLE_FULL = nnx.All(nnx.Param, nnx.Not(Buffer), nnx.Not(nnx.LoRAParam))


def build_model(suite, mode: str, options, **model_options):
    """The transformer with identical random weights (and LoRA adapters for mode "lora")."""
    lora = mode == "lora"
    wl = suite.workload
    model = weights.jax_module(wl.transformer_class, suite.transformer, dtype=jnp.bfloat16,
                               param_dtype=jnp.bfloat16 if lora else jnp.float32,
                               attention_impl=options.attention_impl, remat=options.remat,
                               **model_options)
    if lora:
        attach_lora(model, wl.lora_targets, suite.lora_rank, suite.lora_alpha)
        layers = find_targets(model, wl.lora_targets)
        a = weights.lora_a({p: m.in_features for p, m in layers.items()}, suite.lora_rank)
        device = jax.local_devices()[0]
        for path, layer in layers.items():
            layer.lora_a[...] = jax.device_put(a[path], device)
    return model


def step_fn(graphdef, tx, suite):
    """The train step (params, opt_state, rest, batch) -> (params, opt_state, loss), unjitted."""
    wl = suite.workload

    def step(params, opt_state, rest, batch):
        x_t = noisy_latents(batch["x0"], batch["noise"], batch["sigmas"])

        def loss_fn(p):
            model = nnx.merge(graphdef, p, rest)
            v = wl.jax_velocity(suite, model, x_t, batch)
            return flow_matching_loss(v, batch["noise"], batch["x0"], batch["sigmas"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt_state, _ = apply_gradients(tx, params, opt_state, grads)
        return params, opt_state, loss

    return step


def make_step(graphdef, tx, suite):
    # one device, but under a mesh as training runs: the activation constraints are traced
    return mesh_jit(step_fn(graphdef, tx, suite), mesh=make_mesh(devices=jax.local_devices()[:1]),
                    donate_argnums=(0, 1))


def optimizer(mode: str):
    o = OPTIM[mode]
    return make_optimizer(o["lr"], weight_decay=o["weight_decay"], betas=o["betas"], eps=o["eps"],
                          grad_norm_clip=o["clip"])


def step_flops(suite, mode: str, remat: str) -> dict:
    return suite.workload.train_flops(suite, mode == "lora", remat)


def run(suite, mode: str, options, peak_flops: float | None) -> dict:
    """Time one train step of `mode` ("full" | "lora"); returns the stack record."""
    start = time.perf_counter()
    model = build_model(suite, mode, options)
    timing.progress(f"train_{mode}/wfm_jax: weights built in {time.perf_counter() - start:.1f} s")
    attention_impl = resolved_attention(model, suite)
    wrt = nnx.LoRAParam if mode == "lora" else TRAINABLE_FULL
    graphdef, params, rest = nnx.split(model, wrt, ...)
    del model
    tx = optimizer(mode)
    opt_state = tx.init(params)
    device = jax.local_devices()[0]
    batch = {k: jax.device_put(v, device) for k, v in inputs.train_batch(suite).items()}
    start = time.perf_counter()
    compiled = make_step(graphdef, tx, suite).lower(params, opt_state, rest, batch).compile(
        compiler_options=suite.compiler_options)
    compile_s = time.perf_counter() - start
    timing.progress(f"train_{mode}/wfm_jax: compiled in {compile_s:.1f} s")
    state = {"params": params, "opt_state": opt_state, "losses": []}

    def call():
        p, o, loss = compiled(state["params"], state["opt_state"], rest, batch)
        state["params"], state["opt_state"] = p, o
        state["losses"].append(loss)
        return p, o, loss

    t = timing.time_calls(call, jax.block_until_ready, warmup=suite.warmup, repeats=suite.repeats)
    t["first_call_s"] += compile_s
    trace = timing.profile_calls(call, jax.block_until_ready, options.profile, f"train_{mode}")
    f = step_flops(suite, mode, options.remat)
    n_trained = sum(x.size for x in jax.tree.leaves(params))
    return timing.record(
        "wfm_jax", f"wfm_jax {suite.workload.transformer_class} "
        f"({'LoRA' if mode == 'lora' else 'full'}), "
        f"jit + donation, attention={attention_impl}, remat={options.remat}",
        t, samples=suite.train_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.jax_peak_memory(),
        compile_time_s=t["first_call_s"] - t["step_time_s"],
        compile_note="first call (trace + lower + XLA compile + run) minus the steady step",
        extra={"first_loss": float(state["losses"][0]), "trained_params": int(n_trained),
               "attention_impl": attention_impl, "profile_dir": trace,
               "recompute_flops": f["recompute"],
               "xla_memory_plan_bytes": xla_plan_bytes(compiled)})


def resolved_attention(transformer, suite) -> str | None:
    """The attention kernel the model's layers run for the suite's longest sequence ("auto" is
    resolved at construction on GPU/TPU, per sequence length elsewhere)."""
    attn = suite.workload.attention_module(transformer)
    if attn.attention_impl != "auto":
        return attn.attention_impl
    return resolve_attention_impl("auto", transformer.dtype, attn.head_dim,
                                  seq_len=suite.workload.tokens(suite))


def xla_plan_bytes(compiled) -> int | None:
    """Arguments + outputs + temporaries - donated aliases, as XLA planned the program."""
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - m.alias_size_in_bytes)
    except Exception:  # not every backend / version offers the analysis
        return None


def trained_paths(model, mode: str) -> list[str]:
    """Paths the step trains (for tests: the Buffer and LoRA exclusions)."""
    wrt = nnx.LoRAParam if mode == "lora" else TRAINABLE_FULL
    return sorted(path_str(p) for p, _ in nnx.state(model, wrt).flat_state())
