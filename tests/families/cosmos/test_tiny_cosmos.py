"""The torch-free tiny Cosmos2_5_PredictBasePipeline builder (`python -m wfm_jax.tiny --family
cosmos DIR`): diffusers loads what it writes (no safety checker stored: cosmos_guardrail is not
installed, a stand-in is passed), every weight is read with no missing or unexpected key, the
configs are what diffusers writes, builds are seeded; a full fine-tune's export (train/export.py,
generic) is a Cosmos pipeline diffusers loads, whose transformer reproduces the JAX one."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx

from converters.loading import load_model
from wfm_jax.cli import tiny as tiny_cli
from wfm_jax.families import tiny
from wfm_jax.families.cosmos import tiny as tiny_cosmos
from wfm_jax.train.export import export_full_pipeline


class PassingSafetyChecker:
    def to(self, *args, **kwargs):
        return self

    def check_text_safety(self, prompt):
        return True


@pytest.fixture(scope="module")
def cosmos_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny_cosmos") / "pipe"),
                                    family="cosmos")


def _load(directory):
    from diffusers import Cosmos2_5_PredictBasePipeline
    from diffusers.models.transformers import transformer_cosmos
    transformer_cosmos.transforms = SimpleNamespace(  # torchvision absent: its exact resize
        functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                                   F.interpolate(img, size=size, mode="nearest")),
        InterpolationMode=SimpleNamespace(NEAREST="nearest"))
    return Cosmos2_5_PredictBasePipeline.from_pretrained(directory,
                                                         safety_checker=PassingSafetyChecker())


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
    return out


def test_diffusers_loads_every_component(cosmos_dir):
    from transformers import Qwen2_5_VLForConditionalGeneration
    pipe = _load(cosmos_dir)
    assert type(pipe).__name__ == "Cosmos2_5_PredictBasePipeline"
    for name, (_, cls_name, _) in tiny_cosmos.MODELS.items():
        cls = type(getattr(pipe, name))
        assert cls.__name__ == cls_name
        kw = dict(output_loading_info=True)
        if cls is Qwen2_5_VLForConditionalGeneration:
            _, info = cls.from_pretrained(os.path.join(cosmos_dir, name), **kw)
        else:
            _, info = cls.from_pretrained(cosmos_dir, subfolder=name, **kw)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info.get(kind), f"{name}: {kind} {info[kind]}"
    text = pipe.text_encoder.config.text_config
    assert (pipe.transformer.config.crossattn_proj_in_channels
            == text.num_hidden_layers * text.hidden_size == tiny_cosmos.TEXT_WIDTH)
    assert pipe.transformer.config.in_channels == pipe.vae.config.z_dim + 1
    assert text.vocab_size == len(pipe.tokenizer)
    s = pipe.scheduler.config
    assert (s.use_karras_sigmas, s.use_flow_sigmas, s.sigma_min, s.sigma_max,
            s.prediction_type) == (True, True, 0.01, 200.0, "flow_prediction")
    with open(os.path.join(cosmos_dir, "model_index.json")) as f:
        assert json.load(f)["safety_checker"] == [None, None]


def test_configs_are_what_diffusers_writes(cosmos_dir):
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler
    for name, cls, file in (("transformer", CosmosTransformer3DModel, "config.json"),
                            ("vae", AutoencoderKLWan, "config.json"),
                            ("scheduler", UniPCMultistepScheduler, "scheduler_config.json")):
        with open(os.path.join(cosmos_dir, name, file)) as f:
            written = f.read()
        config = {k: v for k, v in json.loads(written).items() if not k.startswith("_")}
        assert cls(**config).to_json_string() == written, name


def test_seeded_and_cli(cosmos_dir, tmp_path, capsys):
    again = tiny.build_tiny_pipeline(str(tmp_path / "again"), family="cosmos")
    assert _files(again) == _files(cosmos_dir)
    assert tiny_cli.main(["--family", "cosmos", "--seed", "1", str(tmp_path / "other")]) == 0
    other = _files(str(tmp_path / "other"))
    assert other.keys() == _files(cosmos_dir).keys()
    key = "transformer/diffusion_pytorch_model.safetensors"
    assert other[key] != _files(cosmos_dir)[key]
    capsys.readouterr()
    assert tiny_cli.main(["--family", "cosmos", str(tmp_path / "other")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_full_export_is_a_cosmos_pipeline_diffusers_loads(cosmos_dir, tmp_path):
    model, config = load_model(cosmos_dir, component="transformer")
    rng = np.random.default_rng(0)
    for _, var in nnx.state(model, nnx.Param).flat_state():  # stand-in for a fine-tune
        var[...] = var[...] + jnp.asarray(0.05 * rng.standard_normal(var.shape), jnp.float32)
    dst = str(tmp_path / "safetensors" / "step_2")
    assert export_full_pipeline(model, config, cosmos_dir, dst) == dst
    pipe = _load(dst)
    x = rng.standard_normal((1, 4, 3, 4, 4)).astype(np.float32)
    t = np.full((1, 1, 3, 1, 1), 0.7, np.float32)
    t[:, :, 0] = 1e-4
    mask = np.zeros((1, 1, 3, 4, 4), np.float32)
    mask[:, :, 0] = 1
    text = rng.standard_normal((1, 7, tiny_cosmos.TEXT_WIDTH)).astype(np.float32)
    with torch.no_grad():
        want = pipe.transformer(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(text),
                                condition_mask=torch.from_numpy(mask),
                                padding_mask=torch.zeros(1, 1, 32, 32),
                                return_dict=False)[0].numpy()
    graph, state = nnx.split(model)
    got = jax.jit(lambda s: nnx.merge(graph, s)(x, t, text, condition_mask=mask))(state)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)
    source, _ = load_model(cosmos_dir, component="transformer")
    graph0, state0 = nnx.split(source)
    before = jax.jit(lambda s: nnx.merge(graph0, s)(x, t, text, condition_mask=mask))(state0)
    assert float(np.max(np.abs(np.asarray(before) - want))) > 1e-3  # the export is the fine-tune
