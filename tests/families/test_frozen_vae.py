"""The frozen VAE stays replicated (issue #21 item 3), on purpose: its weights are small next to
an 80 GB device, while splitting its convolutions over fsdp would all-gather every kernel in
every rollout decode and SFT encode. Per device in bf16 (counted here from the real configs):
SD3's AutoencoderKL 83.8M parameters = 160 MiB, the Wan2.1 VAE (Wan, Cosmos-Predict2.5,
SANA-Video) 126.9M = 242 MiB; SANA's DC-AE f32c32 is about 353M = 673 MiB (0.8% of 80 GB).
T5-XXL (4.8B, 9.5 GB in bf16) is the frozen component worth splitting, and is
(test_frozen_components)."""
from __future__ import annotations

import math
import os

import jax.numpy as jnp
from flax import nnx

from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import load_config
from wfm_jax.core import mesh as wmesh
from wfm_jax.core.abstract import abstract_module
from wfm_jax.train import setup as setup_lib

CONFIGS = CONFIGS
MiB = 2 ** 20


def _param_bytes(make) -> int:
    model = abstract_module(make)
    return sum(math.prod(v.get_value().shape) * v.get_value().dtype.itemsize
               for _, v in nnx.state(model, nnx.Param).flat_state())


def test_real_vaes_are_small_in_bf16():
    from wfm_jax.bench.suites import SD3_VAE
    from wfm_jax.models.vae.autoencoder_kl import AutoencoderKL
    from wfm_jax.models.wan.vae import AutoencoderKLWan
    sd3 = _param_bytes(lambda: AutoencoderKL(SD3_VAE, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    wan = _param_bytes(lambda: AutoencoderKLWan({}, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    assert round(sd3 / MiB) == 160 and round(wan / MiB) == 242


def test_vae_loads_replicated_in_the_compute_dtype(tmp_path):
    from wfm_jax.families.tiny import build_tiny_pipeline
    config = load_config(os.path.join(CONFIGS, "sd35_sft.py"), [
        ("policy.model_name_or_path", build_tiny_pipeline(str(tmp_path / "pipe"), seed=0))])
    mesh = wmesh.make_mesh(config.policy.parallelism)
    assert mesh.shape["fsdp"] == 8
    pipe = setup_lib.load_pipeline(config, mesh, wmesh.active_rules())
    weights = [v.get_value() for _, v in nnx.state(pipe.vae, nnx.Param).flat_state()]
    assert {w.dtype for w in weights} == {jnp.dtype(jnp.bfloat16)}
    assert all(w.sharding.is_fully_replicated for w in weights)
    assert all(w.sharding.mesh.shape == mesh.shape for w in weights)  # on the mesh, not one device
