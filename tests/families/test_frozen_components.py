"""What training never updates is kept small: the VAE and text encoders load in the compute
dtype (not as fp32 master copies) and the text encoders are split over fsdp like the
transformer; the full fine-tune recipes default to an FSDP mesh."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import load_config
from wfm_jax.core import mesh as wmesh
from wfm_jax.train import setup as setup_lib

CONFIGS = CONFIGS


@pytest.mark.parametrize("recipe", ["sd35_sft.py", "sd35_ddrl.py"])
def test_full_fine_tune_recipes_default_to_fsdp(recipe):
    p = load_config(os.path.join(CONFIGS, recipe)).policy.parallelism
    assert (p.data, p.fsdp, p.context) == (1, -1, 1)


def test_frozen_components_in_compute_dtype_and_sharded(tmp_path):
    from wfm_jax.families.tiny import build_tiny_pipeline
    pipe_dir = build_tiny_pipeline(str(tmp_path / "pipe"), seed=0)
    config = load_config(os.path.join(CONFIGS, "sd35_sft.py"),
                         [("policy.model_name_or_path", pipe_dir)])
    mesh = wmesh.make_mesh(config.policy.parallelism)
    assert mesh.shape["fsdp"] == 8
    pipe = setup_lib.load_pipeline(config, mesh, wmesh.active_rules())

    def floats(module):
        return [v.get_value() for _, v in nnx.state(module, nnx.Param).flat_state()
                if jnp.issubdtype(v.get_value().dtype, jnp.floating)]

    assert {x.dtype for x in floats(pipe.transformer)} == {jnp.dtype(jnp.float32)}
    for frozen in [pipe.vae, *[e for e in pipe.text_encoders if e is not None]]:
        assert {x.dtype for x in floats(frozen)} == {jnp.dtype(jnp.bfloat16)}
    for encoder in [e for e in pipe.text_encoders if e is not None]:
        split = [x for x in floats(encoder) if "fsdp" in jax.tree.leaves(tuple(x.sharding.spec))]
        assert split, "no text-encoder weight is split over fsdp"
