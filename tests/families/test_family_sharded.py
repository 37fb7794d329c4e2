"""The Wan, Cosmos, SANA and SANA-Video DiTs on the 8-device mesh
(data=2 x fsdp=2 x context=2, the tokens split over `context`): its forward and one whole SFT
train step (loss, gradient norm, updated parameters, EMA) equal the single-device ones in fp32;
policy.remat reaches the loaded transformer. Text comes from the family's own encoder."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.config.schema import default_config
from wfm_jax.core import mesh as wmesh
from wfm_jax.models.layers.remat import check_remat
from wfm_jax.programs.sft import sft_step
from wfm_jax.train import setup as setup_lib

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

BATCH = 4  # rows split over data x fsdp = 4; the tokens (12 to 32) over context = 2
SIZES = dict(data=2, fsdp=2, context=2)
PROMPTS = ["a red circle", "two blue squares", "a yellow triangle on black", ""]
# family -> (frames, text tokens): 9 frames of 32x32 give 12 tokens (Wan, Cosmos); SANA-Video's
# 13 give 4 latent frames of 2x2 tokens, 2 frames per context shard, so the temporal conv
# exchanges halo frames across the split (with its kernel's input channels over fsdp: the case
# XLA's own conv partitioning got wrong); Cosmos' chat template alone is about 100 tokens of the
# tiny byte-level vocab
FAMILIES = {"wan": (9, 16), "cosmos": (9, 128), "sana": (None, 16), "sana_video": (13, 16)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request, tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    path = str(tmp_path_factory.mktemp(request.param) / "pipe")
    return request.param, build_tiny_pipeline(path, seed=0, family=request.param)


def _config(family_dir, out_dir, remat="none"):
    family, model_dir = family_dir
    c = default_config()
    c.train.output_dir = str(out_dir)
    c.train.param_dtype = c.train.compute_dtype = "float32"
    c.train.optm_lr, c.train.optm_warmup_steps = 1e-3, 0
    c.train.ema_enable, c.train.ema_decay = True, 0.9
    c.policy.family = family
    c.policy.diffusers.is_video = FAMILIES[family][0] is not None
    c.policy.model_name_or_path = model_dir
    c.policy.remat = remat
    return c


def _inputs(pipe, family):
    frames, tokens = FAMILIES[family]
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(pipe.latent_shape(BATCH, 32, 32, frames=frames)).astype(np.float32)
    cond = jax.tree.map(np.asarray, pipe.encode_prompt(PROMPTS, tokens))
    return x0, cond, np.arange(BATCH, dtype=np.int32)


def _run(family_dir, out_dir, monkeypatch, n_devices, remat="none"):
    """(velocity, loss metrics, updated params, EMA) of one SFT step on an n-device mesh."""
    sizes = SIZES if n_devices == 8 else dict(data=1, fsdp=1, context=1)
    mesh = wmesh.make_mesh(devices=jax.devices()[:n_devices], **sizes)
    monkeypatch.setattr(setup_lib, "build_mesh", lambda config: mesh)
    setup = setup_lib.build(_config(family_dir, out_dir, remat))
    try:
        pipe, rows = setup.pipe, setup.batch_sharding()
        # the recipe's policy.remat reached the DiT the step runs
        assert setup_lib.merge(setup.graphdef, setup.state.params, setup.frozen).remat == check_remat(remat)
        x0, cond, ids = (jax.device_put(a, rows) for a in jax.tree.map(jnp.asarray,
                                                                        _inputs(pipe, family_dir[0])))
        t = jax.device_put(jnp.array([999.0, 700.0, 300.0, 20.0]), rows)
        family, graphdef = pipe.shell(), setup.graphdef
        forward = wmesh.mesh_jit(
            lambda p, f, x, t, c: family.velocity_with(setup_lib.merge(graphdef, p, f), x, t, c),
            mesh=setup.mesh, rules=setup.rules)
        velocity = np.asarray(forward(setup.state.params, setup.frozen, x0, t, cond))
        step = sft_step(setup, (pipe.shift, "logit_normal", 0.0, 1.0, 1.29, (0, 0)))
        state, metrics = step(setup.state, setup.frozen, x0, cond, ids)
        host = lambda tree: jax.tree.map(np.asarray, jax.device_get(tree))
        return velocity, host(metrics), host(state.params), host(state.ema)
    finally:
        setup.close()


@pytest.mark.slow
def test_forward_and_sft_step_on_8_devices_equal_one_device(family_dir, tmp_path, monkeypatch):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    one = _run(family_dir, tmp_path / "one", monkeypatch, 1)
    # remat "full" on the mesh: rematerialised blocks must not change a number either
    eight = _run(family_dir, tmp_path / "eight", monkeypatch, 8, remat="full")
    np.testing.assert_allclose(eight[0], one[0], atol=1e-5, rtol=1e-5)
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(eight[1][key], one[1][key], atol=1e-5, rtol=1e-5)
    assert np.isfinite(one[1]["loss"]) and one[1]["grad_norm"] > 0
    for tree_8, tree_1 in ((eight[2], one[2]), (eight[3], one[3])):
        leaves_8, leaves_1 = jax.tree.leaves(tree_8), jax.tree.leaves(tree_1)
        assert len(leaves_8) == len(leaves_1)
        for a, b in zip(leaves_8, leaves_1):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
