"""Remat must save memory in the compiled SD3.5-Medium-shaped train step: with the blocks run as
scanned stacks, `full` at least halves XLA's temp bytes against `none` (abstract weights: nothing
is allocated; the numbers come from the compiled program's memory analysis). Six of SD3.5-M's
blocks (three with the second attention, two plain, the last), so that each kind still scans:
measured 12.0 GiB against 4.35 GiB (x2.76), compiling in 17 s each where the 24 blocks took 43 s
(the ratio grows with the depth: only `none` keeps every block's activations)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from wfm_jax.algorithms.sft import flow_matching_loss
from wfm_jax.bench.suites import SD35_MEDIUM
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.models.layers.remat import check_remat
from wfm_jax.models.sd3.transformer import SD3Transformer
from wfm_jax.programs.stats import CPU_COMPILE_ONLY

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

SIX_BLOCKS = {**SD35_MEDIUM, "num_layers": 6, "dual_attention_layers": [0, 1, 2]}


@functools.cache  # one abstract model for every policy: its init traces in 6-11 s
def _six_blocks():
    return abstract_module(lambda: SD3Transformer(SIX_BLOCKS, dtype=jnp.bfloat16,
                                                  rngs=nnx.Rngs(0)))


def step_temp_bytes(remat: str, batch: int = 2, latent: int = 64, text: int = 333) -> int:
    """Temp bytes of value_and_grad of the flow-matching loss (bf16 compute, fp32 weights) at
    512x512 (1024 image + 333 text tokens), one device."""
    model = _six_blocks()
    model.remat = check_remat(remat)  # read when the blocks run (run_blocks), not at init
    graph, params, rest = nnx.split(model, nnx.All(nnx.Param, nnx.Not(Buffer)), ...)

    def grads(params, rest, x0, noise, embeds, pooled, sigmas):
        def loss(p):
            v = nnx.merge(graph, p, rest)(x0, embeds, pooled, sigmas * 1000)
            return flow_matching_loss(v, noise, x0, sigmas)
        return jax.value_and_grad(loss)(params)

    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    x = f32(batch, 16, latent, latent)
    # compiled to be measured, never run: the planner's CPU options (same buffers at every level)
    compiled = jax.jit(grads).lower(params, rest, x, x, f32(batch, text, 4096),
                                    f32(batch, 2048), f32(batch)).compile(CPU_COMPILE_ONLY)
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_full_remat_at_least_halves_the_sd35_medium_step_temp():
    none, full = step_temp_bytes("none"), step_temp_bytes("full")
    assert full <= none / 2, f"temp: remat none {none / 2**30:.1f} GiB, full {full / 2**30:.1f} GiB"
