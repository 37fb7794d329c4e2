"""PipelineFamily.cond_storage_dtypes: RL stores each prompt's conditioning for the update in the
dtype a family declares for it (programs/rl_encode.py); that must change no bit of the velocity,
because the transformer casts the key to its compute dtype before any other use. On the tiny
random Cosmos and Wan pipelines in bf16: the velocity of conditioning stored in the declared
dtype equals that of the float32 encoding, bit for bit (and a family that declares nothing,
SD3, keeps float32)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wfm_jax.families import base as fam
from wfm_jax.families import tiny


@pytest.mark.parametrize("family", ["cosmos", "wan"])
def test_stored_conditioning_gives_the_same_velocity(family, tmp_path):
    path = tiny.build_tiny_pipeline(str(tmp_path / "pipe"), seed=0, family=family)
    pipe = fam.load_pipeline(path, family=family, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                             text_dtype=jnp.bfloat16, frozen_param_dtype=jnp.bfloat16)
    dtypes = pipe.cond_storage_dtypes("bfloat16")
    assert dtypes == {"encoder_hidden_states": jnp.dtype(jnp.bfloat16)}
    cond = pipe.encode_prompt(["a red ball", "a blue cube"], 16)
    assert all(v.dtype == jnp.float32 for v in cond.values())
    stored = {k: v.astype(dtypes.get(k, v.dtype)) for k, v in cond.items()}
    assert stored["encoder_hidden_states"].dtype == jnp.bfloat16
    shape = pipe.latent_shape(2, 32, 32, frames=5)
    x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
    t = jnp.asarray([700.0, 250.0], jnp.float32)
    # jitted, one program per conditioning dtype (eager, each op compiled on its own: ~150)
    graph, state = nnx.split(pipe.transformer)
    velocity = jax.jit(lambda s, c: pipe.velocity_with(nnx.merge(graph, s), x, t, c))
    want = velocity(state, cond)
    got = velocity(state, stored)
    assert np.array_equal(np.asarray(want), np.asarray(got))
    other = {k: v * 2 for k, v in cond.items()}  # the conditioning matters to the velocity
    assert not np.array_equal(np.asarray(want), np.asarray(velocity(state, other)))


def test_a_family_that_declares_nothing_keeps_float32():
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    assert SD3Pipeline.cond_storage_dtypes(None, "bfloat16") == {}
