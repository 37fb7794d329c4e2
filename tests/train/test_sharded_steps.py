"""The sharding the config asks for is what the compiled train step does: traced under the mesh,
the SFT step splits the token sequence over `context` and each device's FLOPs halve with
context=2 (read from XLA's cost analysis and the lowered program, not timed)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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

BATCH, LATENT, TEXT = 8, 16, 24  # 64 image + 24 text tokens: both split evenly by context=2


def _placed_model(mesh):
    model = SD3Transformer(_tiny_sd3.CONFIG, rngs=nnx.Rngs(0))
    shardings = model_shardings(model, mesh)
    for path, var in nnx.state(model).flat_state():
        var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
    return model


def _lowered_sft_step(tmp_path, monkeypatch, sizes: dict, n_devices: int):
    mesh = wmesh.make_mesh(devices=jax.devices()[:n_devices], **sizes)
    monkeypatch.setattr(setup_lib, "build_mesh", lambda config: mesh)
    config = default_config()
    config.train.output_dir = str(tmp_path / f"out{n_devices}")
    config.train.compute_dtype = "float32"
    pipe = SD3Pipeline("", _placed_model(mesh), None, (), (), _tiny_sd3.CONFIG, {}, {})
    setup = setup_lib.build(config, pipe=pipe)
    try:
        step = sft_step(setup, (3.0, "logit_normal", 0.0, 1.0, 1.29, (0, 0)))
        cfg = _tiny_sd3.CONFIG
        rows = setup.batch_sharding()
        arg = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
        return step.lower(setup.state, setup.frozen,
                          arg((BATCH, cfg["in_channels"], LATENT, LATENT)),
                          {"prompt_embeds": arg((BATCH, TEXT, cfg["joint_attention_dim"])),
                           "pooled_projections": arg((BATCH, cfg["pooled_projection_dim"]))},
                          arg((BATCH,), jnp.int32))
    finally:
        setup.close()


def _flops(lowered) -> float:
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


@pytest.mark.slow
def test_sft_step_splits_the_sequence_over_context_and_halves_per_device_flops(tmp_path,
                                                                                monkeypatch):
    cp = _lowered_sft_step(tmp_path, monkeypatch, dict(data=2, fsdp=2, context=2), 8)
    text = cp.as_text()
    # activation constraints carry the context axis on the sequence dimension
    seq_split = [line for line in text.splitlines()
                 if "sharding_constraint" in line and '{"context"}' in line]
    assert seq_split, "no sequence-split sharding constraint in the SFT step"
    no_cp = _lowered_sft_step(tmp_path, monkeypatch, dict(data=2, fsdp=2, context=1), 4)
    ratio = _flops(cp) / _flops(no_cp)
    assert ratio < 0.6, f"per-device FLOPs at context=2 are {ratio:.2f} of context=1's"


def test_mesh_jit_traces_under_the_mesh_and_its_rules():
    mesh = wmesh.make_mesh(data=2, fsdp=2, context=2)
    seen = {}

    def fn(x):
        seen["mesh"] = jax.sharding.get_abstract_mesh()
        seen["rules"] = dict(wmesh.active_rules())["act_seq"]
        return wmesh.constrain(x, ("act_batch", "act_seq"))

    jitted = wmesh.mesh_jit(fn, mesh=mesh, rules=wmesh.rules_with({"act_seq": None}))
    out = jitted(jnp.ones((4, 6)))
    assert not seen["mesh"].empty and seen["rules"] is None
    assert out.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    jitted(jnp.zeros((4, 6)))
    assert jitted.compiles() == 1
    np.testing.assert_array_equal(np.asarray(out), 1.0)
