"""wfm_jax train steps of a suite: full fine-tune and LoRA of its transformer (SD3 MMDiT, Cosmos
DiT: bench/families.py), timed as the trainer runs them: the step is programs.build's SFT step
(programs/sft.py: the family's velocity, flow-matching loss, grads, global-norm clip, AdamW,
the state donated) on a one-device Setup holding the suite's random weights. Full: fp32 master
weights, every Param but the position-table Buffer trained. LoRA: frozen bf16 base, fp32
adapters (the SD3.5 NFT recipe's "bf16 params").

`bench_recipe` is the run's recipe (optimizer, dtypes, LoRA, attention, remat); the torch side
reads the same inputs (inputs.train_batch draws them as this step does).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.bench import devices, inputs, timing, weights
from wfm_jax.bench.suites import OPTIM
from wfm_jax.core import mesh as wmesh
from wfm_jax.core.tree import path_str
from wfm_jax.models.layers.attention import resolve_attention_impl
from wfm_jax.models.lora import attach_lora, find_targets
from wfm_jax.programs import build
from wfm_jax.programs import setup as setup_lib
from wfm_jax.programs.state import TrainState


def bench_recipe(suite, mode: str, options) -> Any:
    """The recipe of a suite's train workload: OPTIM[mode]'s AdamW at a constant rate, no EMA,
    bf16 compute over fp32 (full) or bf16 (LoRA base) weights, the suite's LoRA."""
    from wfm_jax.config.schema import default_config
    c, o, lora = default_config(), OPTIM[mode], mode == "lora"
    t = c.train
    t.optm_lr, t.optm_weight_decay, t.optm_betas = o["lr"], o["weight_decay"], tuple(o["betas"])
    t.optm_eps, t.optm_grad_norm_clip = o["eps"], o["clip"]
    t.optm_warmup_steps, t.lr_schedule, t.grad_accum_steps, t.ema_enable = 0, "constant", 1, False
    t.param_dtype, t.compute_dtype = ("bfloat16" if lora else "float32"), "bfloat16"
    t.train_batch_per_replica, t.seed = suite.train_batch, inputs.SEED
    c.policy.family = suite.family
    c.policy.lora.enable = lora
    c.policy.lora.target_modules = tuple(suite.workload.lora_targets)
    c.policy.lora.r = suite.lora_rank
    with c.ignore_type():  # the suites' alphas are floats (the schema's int is peft's usual)
        c.policy.lora.lora_alpha = suite.lora_alpha
    c.policy.attention_impl, c.policy.remat = options.attention_impl, options.remat
    scan_layers = options.scan_layers_for(suite)
    if scan_layers is not None:
        c.policy.scan_layers = scan_layers
    c.policy.diffusers.weighting_scheme = "logit_normal"  # inputs.train_batch's density
    return c


def build_model(suite, mode: str, options, **model_options):
    """The transformer with identical random weights (and LoRA adapters for mode "lora")."""
    lora = mode == "lora"
    wl = suite.workload
    scan_layers = options.scan_layers_for(suite)
    if scan_layers is not None:
        model_options.setdefault("scan_layers", scan_layers)
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


@dataclasses.dataclass
class BenchSetup:
    """A programs.Setup on one device with the suite's weights (no VAE: no sampler)."""
    config: Any
    mesh: Any
    rules: Any
    pipe: Any
    graphdef: Any
    frozen: Any
    tx: Any
    state: TrainState
    shardings: TrainState

    def batch_sharding(self):
        return setup_lib.batch_sharding(self.mesh, self.rules)

    def vae_state(self):
        return None


def bench_setup(suite, mode: str, options, model) -> BenchSetup:
    """`model`'s trained part (LoRA adapters, or every Param but Buffers) in a TrainState, on
    a one-device mesh (the activation constraints traced as training traces them)."""
    config = bench_recipe(suite, mode, options)
    mesh = wmesh.make_mesh(devices=jax.local_devices()[:1])
    rules = wmesh.active_rules()
    rep = NamedSharding(mesh, P())
    graphdef, params, frozen = setup_lib.split_model(model, mode == "lora")
    params, frozen = jax.device_put((params, frozen), rep)
    tx, _ = setup_lib.make_tx(config)
    init = setup_lib.state_init(config, tx)
    rng = jax.device_put(jax.random.key(inputs.SEED), rep)
    abstract = jax.eval_shape(init, params, rng)
    shardings = setup_lib.state_shardings(abstract, jax.tree.map(lambda _: rep, params), mesh, tx)
    state = jax.jit(init, out_shardings=shardings)(params, rng)
    return BenchSetup(config, mesh, rules, suite.workload.pipeline(suite), graphdef, frozen, tx,
                      state, shardings)


def step_flops(suite, mode: str, remat: str) -> dict:
    return suite.workload.train_flops(suite, mode == "lora", remat)


def train(suite, mode: str, options, peak_flops: float | None) -> dict:
    """Time one train step of `mode` ("full" | "lora"); returns the stack record."""
    start = time.perf_counter()
    model = build_model(suite, mode, options)
    timing.progress(f"train_{mode}/wfm_jax: weights built in {time.perf_counter() - start:.1f} s")
    attention_impl = resolved_attention(model, suite)
    scan_layers = bool(getattr(model, "scan_layers", False))
    setup = bench_setup(suite, mode, options, model)
    del model
    step = build(setup).sft_step
    batch = inputs.train_batch(suite)
    x0, cond, ids = jax.device_put((batch["x0"], inputs.text_of(batch), batch["ids"]),
                                   setup.batch_sharding())
    start = time.perf_counter()
    compiled = step.lower(setup.state, setup.frozen, x0, cond, ids).compile(
        compiler_options=suite.compiler_options)
    compile_s = time.perf_counter() - start
    timing.progress(f"train_{mode}/wfm_jax: compiled in {compile_s:.1f} s")
    n_trained = sum(x.size for x in jax.tree.leaves(setup.state.params))
    state = {"state": setup.state, "losses": []}

    def call():
        s, metrics = compiled(state["state"], setup.frozen, x0, cond, ids)
        state["state"] = s
        state["losses"].append(metrics["loss"])
        return s, metrics

    t = timing.time_calls(call, jax.block_until_ready, warmup=suite.warmup, repeats=suite.repeats)
    t["first_call_s"] += compile_s
    back_to_back = timing.time_back_to_back(call, jax.block_until_ready, repeats=suite.repeats)
    timing.progress(f"train_{mode}/wfm_jax: {t['step_time_s'] * 1e3:.1f} ms a step waited for, "
                    f"{back_to_back * 1e3:.1f} ms a step dispatched back to back")
    trace = timing.profile_calls(call, jax.block_until_ready, options.profile, f"train_{mode}")
    f = step_flops(suite, mode, options.remat)
    return timing.record(
        "wfm_jax", f"wfm_jax {suite.workload.transformer_class} "
        f"({'LoRA' if mode == 'lora' else 'full'}), "
        f"programs.sft_step (jit + donation), attention={attention_impl}, remat={options.remat}, "
        f"scan_layers={scan_layers}",
        t, samples=suite.train_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.jax_peak_memory(),
        compile_time_s=t["first_call_s"] - t["step_time_s"],
        compile_note="first call (trace + lower + XLA compile + run) minus the steady step",
        extra={"first_loss": float(state["losses"][0]), "trained_params": int(n_trained),
               "attention_impl": attention_impl, "scan_layers": scan_layers,
               "profile_dir": trace, "step_time_back_to_back_s": back_to_back,
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
    return sorted(path_str(p) for p, _ in
                  nnx.state(model, setup_lib.trainable_filter(mode == "lora")).flat_state())
