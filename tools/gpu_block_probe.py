"""Cheap A/B of one tuning lever on a GPU: the bench's full fine-tune step (make_step: forward,
flow-matching loss, grad, clip, AdamW) on an SD3.5-Medium-wide MMDiT cut to a few blocks, with
nnx's own random init (no converter, seconds to build) and a compile of seconds, not minutes.
Run one process per XLA_FLAGS setting; prints one JSON line.

  python tools/gpu_block_probe.py --layers 2 --attention cudnn --batch 4 [--mode full|lora]
"""
import argparse
import dataclasses
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.bench import flops, inputs, suites, train_step
from wfm_jax.models.lora import attach_lora
from wfm_jax.models.sd3.transformer import SD3Transformer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--attention", default="auto")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--mode", default="full", choices=("full", "lora"))
    p.add_argument("--suite", default="gpu")
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    base = suites.get_suite(a.suite, train_batch=a.batch)
    cfg = dict(base.transformer, num_layers=a.layers,
               dual_attention_layers=tuple(range((a.layers + 1) // 2)))  # SD3.5-M: 13 of 24
    suite = dataclasses.replace(base, transformer=cfg)
    lora = a.mode == "lora"
    model = SD3Transformer(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), attention_impl=a.attention,
                           param_dtype=jnp.bfloat16 if lora else jnp.float32)
    if lora:
        attach_lora(model, suites.LORA_TARGETS, suite.lora_rank, suite.lora_alpha)
    impl = train_step.resolved_attention(model)
    wrt = nnx.LoRAParam if lora else train_step.TRAINABLE_FULL
    g, params, rest = nnx.split(model, wrt, ...)
    tx = train_step.optimizer(a.mode)
    opt = tx.init(params)
    batch = {k: jnp.asarray(v) for k, v in inputs.train_batch(suite).items()}
    t0 = time.perf_counter()
    step = train_step.make_step(g, tx).lower(params, opt, rest, batch).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(a.repeats + 2):
        t0 = time.perf_counter()
        params, opt, loss = step(params, opt, rest, batch)
        jax.block_until_ready(loss)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    s = suite.latent_size
    f = flops.train_step(cfg, a.batch, s, s, suite.text_len,
                         lora_targets_=suites.LORA_TARGETS if lora else None,
                         lora_rank=suite.lora_rank)["model"]
    ms = statistics.median(times) * 1e3
    print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""), "mode": a.mode,
                      "layers": a.layers, "batch": a.batch, "attention": impl,
                      "step_ms": round(ms, 2), "tflops_per_s": round(f / ms / 1e9, 1),
                      "compile_s": round(compile_s, 1), "loss": float(loss)}))


if __name__ == "__main__":
    main()
