"""Qwen3-VL on the 8-device CPU mesh (data=2 x fsdp=4): the loader puts each tensor straight into
its shards by the logical axis names, and the jitted forward (vision tower, DeepStack, decoder)
equals the single-device one. Needs XLA_FLAGS=--xla_force_host_platform_device_count=8."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.models.qwen3_vl._oracle import IMAGE, VIDEO, flax_model, left_pad, pixels, torch_model, visual_run
from wfm_jax.core import mesh as wmesh
from wfm_jax.models.qwen3_vl import position_ids

pytest.importorskip("torch")


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_forward_equals_single_device(tmp_path):
    from converters.loading import load_model

    tm = torch_model(seed=4)
    tm.save_pretrained(str(tmp_path))
    mesh = wmesh.make_mesh(data=2, fsdp=4)
    sharded, _ = load_model(str(tmp_path), mesh=mesh)
    kernel = sharded.model.language_model.layers[0].mlp.gate_proj.kernel
    assert kernel[...].sharding.spec[0] == "fsdp"  # ("embed", "mlp") -> ("fsdp", None)
    grid = [[1, 4, 4]] * 4
    rows = [[1, *visual_run(IMAGE, g), 20 + i] for i, g in enumerate(grid)] + [
        [1, 30 + i, 31, 32] for i in range(4)]
    ids, mask = left_pad(rows)
    pos, _ = position_ids(ids, mask, image_grid_thw=grid, image_token_id=IMAGE, video_token_id=VIDEO)
    pv = pixels(grid, seed=12)

    def forward(graphdef, state, ids, mask, pos, pv):
        model = nnx.merge(graphdef, state)
        return model(ids, mask, pos, pv, np.asarray(grid))["logits"]

    run = jax.jit(forward, static_argnums=0)
    args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(pos), jnp.asarray(pv))
    with jax.set_mesh(mesh):
        got = run(*nnx.split(sharded), *args)
    want = run(*nnx.split(flax_model(tm)), *args)
    np.testing.assert_allclose(np.asarray(got)[mask == 1], np.asarray(want)[mask == 1], atol=1e-5,
                               rtol=0)
