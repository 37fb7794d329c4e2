"""Wan exports (issue #12): a full fine-tune is exported as a WanPipeline directory diffusers loads,
and a LoRA adapter loads with `WanPipeline.load_lora_weights`; both reproduce the JAX model's
output (fp32, 1e-4). Weights are perturbed / the adapter made non-zero, so an export that kept
the source weights or dropped the adapter fails."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from converters.loading import load_model
from wfm_jax.config.schema import WAN_LORA_TARGETS  # spec video_models.md §5.5
from wfm_jax.families import tiny
from wfm_jax.models import lora as lora_lib
from wfm_jax.train.export import LORA_WEIGHT_NAME, export_full_pipeline, export_lora

ATOL = 1e-4


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("wan_export") / "pipe"), seed=0,
                                    family="wan")


def _inputs():
    rng = np.random.default_rng(3)
    latents = rng.standard_normal((2, 4, 3, 4, 4), np.float32)
    text = rng.standard_normal((2, 7, 16), np.float32)
    return latents, np.array([900, 130], np.int64), text


def _jax_out(model, latents, t, text):
    graph, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x, t, e: nnx.merge(graph, s)(x, t, e))(
        state, jnp.asarray(latents), jnp.asarray(t), jnp.asarray(text)))


def _torch_out(transformer, latents, t, text):
    with torch.no_grad():
        return transformer(torch.from_numpy(latents), torch.from_numpy(t),
                           torch.from_numpy(text)).sample.numpy()


def test_full_export_is_a_wan_pipeline_diffusers_loads(wan_dir, tmp_path):
    from diffusers import WanPipeline

    model, config = load_model(wan_dir, component="transformer")
    rng = np.random.default_rng(0)
    for _, var in nnx.state(model, nnx.Param).flat_state():  # stand-in for a fine-tune
        var[...] = var[...] + jnp.asarray(0.05 * rng.standard_normal(var.shape), jnp.float32)
    dst = str(tmp_path / "safetensors" / "step_3")
    assert export_full_pipeline(model, config, wan_dir, dst) == dst
    assert sorted(os.listdir(tmp_path / "safetensors")) == ["step_3"]  # no temporary left

    pipe = WanPipeline.from_pretrained(dst)
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"
    for name in ("model_index.json", "vae/diffusion_pytorch_model.safetensors",
                 "text_encoder/model.safetensors", "tokenizer/tokenizer.json",
                 "scheduler/scheduler_config.json", "transformer/config.json"):
        with open(os.path.join(wan_dir, name), "rb") as a, open(os.path.join(dst, name), "rb") as b:
            assert a.read() == b.read(), name  # everything but the weights is the source's
    args = _inputs()
    got, want = _jax_out(model, *args), _torch_out(pipe.transformer, *args)
    source = WanPipeline.from_pretrained(wan_dir).transformer
    assert np.abs(_torch_out(source, *args) - want).max() > 1e-2  # the export is not the source
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_lora_export_loads_with_wan_load_lora_weights(wan_dir, tmp_path):
    from diffusers import WanPipeline

    model, _ = load_model(wan_dir, component="transformer")
    paths = lora_lib.attach_lora(model, WAN_LORA_TARGETS, r=4, lora_alpha=8)
    assert len(paths) == 2 * (2 * 4 + 2)  # two blocks: attn1 + attn2 (4 each), 2 FFN linears
    rng = np.random.default_rng(1)
    for _, var in nnx.state(model, nnx.LoRAParam).flat_state():  # B = 0 would export nothing
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var.shape), jnp.float32)
    _, params, _ = nnx.split(model, nnx.LoRAParam, ...)
    adapter = lora_lib.adapter_config(4, 8, WAN_LORA_TARGETS)
    dst = tmp_path / "step_1"
    export_lora(params, adapter, str(dst))
    assert json.loads((dst / "lora" / "adapter_config.json").read_text())["r"] == 4

    pipe = WanPipeline.from_pretrained(wan_dir)
    args = _inputs()
    base = _torch_out(pipe.transformer, *args)
    pipe.load_lora_weights(str(dst / "lora"), weight_name=LORA_WEIGHT_NAME)
    peft_layers = {name for name, module in pipe.transformer.named_modules()
                   if len(getattr(module, "lora_A", ()))}
    assert peft_layers == set(paths)  # peft targeted exactly the layers wfm_jax did
    want = _torch_out(pipe.transformer, *args)
    assert np.abs(want - base).max() > 1e-2  # the adapter changes the output
    np.testing.assert_allclose(_jax_out(model, *args), want, atol=ATOL, rtol=0)
