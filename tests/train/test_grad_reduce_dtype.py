"""In which dtype the FSDP step reduces its gradients (issue #21 item 5), read from the SFT step's
program right after XLA's SPMD partitioner, on 8 CPU devices (fsdp=8), the tiny SD3
transformer computing in bf16 over fp32 master weights.

Finding: every weight used in the compute dtype has its gradient partial sums reduced in bf16
(the backward dot's output dtype), as torch FSDP with MixedPrecision(param_dtype=bf16,
reduce_dtype=bf16) does; the fp32 islands (AdaLN modulation, time embedding, norms) reduce in
f32. The f32-only reductions the issue reported come from the CPU backend: its
all-reduce-promotion pass widens every bf16 all-reduce after partitioning (GPUs keep bf16).
cosmos-rl reduces in fp32 (fsdp_reduce_dtype, default and only choice "float32"); matching it
would take the weight-gradient dots producing f32 (preferred_element_type in the models'
layers), at twice these reductions' bytes. Kept as is: half the gradient traffic."""
from __future__ import annotations

import glob
import os
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from converters.loading import model_shardings
from tests import _tiny_sd3
from wfm_jax.config.schema import default_config
from wfm_jax.core import mesh as wmesh
from wfm_jax.families.sd3.pipeline import SD3Pipeline
from wfm_jax.models.sd3.transformer import SD3Transformer
from wfm_jax.programs.sft import sft_step
from wfm_jax.train import setup as setup_lib

pytestmark = pytest.mark.slow  # one compile of the tiny step with an HLO dump: ~30 s of CPU

REDUCE = re.compile(r"= (\w+)\[[\d,]*\]\S* all-reduce\(.*op_name=\"([^\"]*)\"")


def _reductions(text: str) -> list[tuple[str, str]]:
    """(dtype, op_name) of every all-reduce of the backward pass (JAX names it transpose(...))."""
    return [(m.group(1), m.group(2)) for m in map(REDUCE.search, text.splitlines())
            if m and "transpose(" in m.group(2)]


def test_weight_gradients_reduce_in_the_compute_dtype(tmp_path, monkeypatch):
    mesh = wmesh.make_mesh(devices=jax.devices()[:8], data=1, fsdp=8, context=1)
    monkeypatch.setattr(setup_lib, "build_mesh", lambda config: mesh)
    model = SD3Transformer(_tiny_sd3.CONFIG, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    shardings = model_shardings(model, mesh)
    for path, var in nnx.state(model).flat_state():
        var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
    config = default_config()
    config.train.output_dir = str(tmp_path / "out")
    setup = setup_lib.build(config, pipe=SD3Pipeline("", model, None, (), (), _tiny_sd3.CONFIG,
                                                     {}, {}))
    try:
        cfg, rows = _tiny_sd3.CONFIG, setup.batch_sharding()
        arg = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
        lowered = sft_step(setup, (3.0, "logit_normal", 0.0, 1.0, 1.29, (0, 0))).lower(
            setup.state, setup.frozen, arg((8, cfg["in_channels"], 16, 16)),
            {"prompt_embeds": arg((8, 24, cfg["joint_attention_dim"])),
             "pooled_projections": arg((8, cfg["pooled_projection_dim"]))}, arg((8,), jnp.int32))
        dump = tmp_path / "hlo"
        compiled = lowered.compile(compiler_options={
            "xla_dump_to": str(dump), "xla_dump_hlo_pass_re": "spmd-partitioning"})
    finally:
        setup.close()
    (partitioned,) = glob.glob(os.path.join(dump, "*jit_step*after_spmd-partitioning*.txt"))
    grads = _reductions(open(partitioned).read())
    weight_grads = [d for d, name in grads if name.endswith("dot_general")]
    assert {d for d, _ in grads} == {"bf16", "f32"}
    assert weight_grads.count("bf16") > 2 * weight_grads.count("f32") > 0  # most: compute dtype
    # the CPU program widens them all (the f32 the issue read)
    assert {d for d, _ in _reductions(compiled.as_text())} == {"f32"}
