"""The torch-free tiny WanPipeline builder (`python -m wfm_jax.tiny --family wan DIR`):
diffusers loads and runs what it writes, the configs are what diffusers/transformers would save,
wfm_jax's converters load every component (the transformer and UMT5 match torch), builds are
seeded and byte-reproducible, and a failed build leaves nothing under the name."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from tests._support.paths import REPO_ROOT
from wfm_jax.cli import tiny as tiny_cli
from wfm_jax.families import tiny
from wfm_jax.families.wan import tiny as tiny_wan

PROMPTS = ["a photo of the cat", "a red dog on the blue sofa"]


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny_wan") / "pipe"), seed=0,
                                    family="wan")


@pytest.fixture(scope="module")
def pipe(wan_dir):
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(wan_dir)


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
    return out


def test_components_load_with_no_missing_or_unexpected_keys(wan_dir, pipe):
    from diffusers import UniPCMultistepScheduler

    assert type(pipe).__name__ == "WanPipeline" and pipe.transformer_2 is None
    for name in tiny_wan.MODELS:
        cls = type(getattr(pipe, name))
        assert cls.__name__ == tiny_wan.MODELS[name][1]
        _, info = cls.from_pretrained(wan_dir, subfolder=name, output_loading_info=True)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info.get(kind), f"{name}: {kind} {info[kind]}"
    sched = pipe.scheduler
    assert isinstance(sched, UniPCMultistepScheduler)
    assert (sched.config.prediction_type, sched.config.use_flow_sigmas,
            sched.config.flow_shift) == ("flow_prediction", True, tiny_wan.FLOW_SHIFT)
    assert pipe.text_encoder.config.vocab_size == len(pipe.tokenizer)
    ids = pipe.tokenizer(PROMPTS[1]).input_ids
    assert ids[-1] == pipe.tokenizer.eos_token_id and pipe.tokenizer.unk_token_id not in ids


def test_configs_are_what_diffusers_and_transformers_write(wan_dir, pipe):
    """Each hand-written config is byte for byte what the library's own save writes for a model
    built from it (no argument missing, none drifting from the class defaults)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel

    for name, cls, file in (("transformer", WanTransformer3DModel, "config.json"),
                            ("vae", AutoencoderKLWan, "config.json"),
                            ("scheduler", UniPCMultistepScheduler, "scheduler_config.json")):
        with open(os.path.join(wan_dir, name, file)) as f:
            written = f.read()
        config = {k: v for k, v in json.loads(written).items() if not k.startswith("_")}
        assert json.loads(written)["_class_name"] == cls.__name__
        assert cls(**config).to_json_string() == written, name
    with open(os.path.join(wan_dir, "text_encoder", "config.json")) as f:
        written = json.load(f)
    assert json.loads(pipe.text_encoder.config.to_json_string(use_diff=True)) == written
    with open(os.path.join(wan_dir, "model_index.json")) as f:
        index = json.load(f)
    saved = {k: list(v) if isinstance(v, tuple) else v for k, v in dict(pipe.config).items()
             if not k.startswith("_")}  # what WanPipeline.save_pretrained would write, except:
    # the release names the tokenizer T5TokenizerFast, which transformers 5 aliases to the
    # T5Tokenizer a save would name
    import transformers
    assert index["tokenizer"] == ["transformers", "T5TokenizerFast"]
    assert transformers.T5TokenizerFast is type(pipe.tokenizer)
    saved["tokenizer"] = index["tokenizer"]
    assert saved == {k: v for k, v in index.items() if not k.startswith("_")}


def test_diffusers_generates_frames(pipe):
    frames = pipe(PROMPTS, height=tiny_wan.HEIGHT, width=tiny_wan.WIDTH,
                  num_frames=tiny_wan.FRAMES, num_inference_steps=2, guidance_scale=5.0,
                  max_sequence_length=12, generator=torch.Generator().manual_seed(0),
                  output_type="np").frames
    assert frames.shape == (2, tiny_wan.FRAMES, tiny_wan.HEIGHT, tiny_wan.WIDTH, 3)
    assert np.isfinite(frames).all() and frames.min() >= 0 and frames.max() <= 1
    for video in frames:  # random weights must still give pictures, not a flat colour
        assert video.std() > 1e-2
    # the prompt reaches the pixels through UMT5 and the transformer's cross-attention
    assert np.abs(frames[0] - frames[1]).max() > 1e-2


def test_jax_loads_every_component_and_matches_torch(wan_dir, pipe):
    """models.loading loads each component from the pipeline dir; the transformer's and UMT5's
    outputs on the same inputs equal torch's (fp32, 2e-5), the VAE holds the same weights."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from converters.loading import load_model
    from wfm_jax.core.tree import flat_params

    models = {name: load_model(wan_dir, component=name)[0] for name in tiny_wan.MODELS}
    n_torch = {name: sum(p.numel() for p in getattr(pipe, name).parameters())
               for name in tiny_wan.MODELS}
    for name, model in models.items():
        n_jax = sum(int(np.prod(v.shape)) for v in flat_params(model).values())
        assert n_jax == n_torch[name], name

    ids = pipe.tokenizer(PROMPTS, padding="max_length", max_length=12,
                         return_tensors="np").input_ids
    mask = (ids != pipe.tokenizer.pad_token_id).astype(np.int32)
    graph, state = nnx.split(models["text_encoder"])
    got = jax.jit(lambda s, i, m: nnx.merge(graph, s)(i, m))(state, jnp.asarray(ids),
                                                              jnp.asarray(mask))
    with torch.no_grad():
        want = pipe.text_encoder(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=2e-5, rtol=0)

    rng = np.random.default_rng(0)
    latents = rng.standard_normal((2, tiny_wan.LATENT_CHANNELS, 3, 4, 4), np.float32)
    text = rng.standard_normal((2, 12, tiny_wan.UMT5_WIDTH), np.float32)
    t = np.array([999, 250], np.int64)
    graph, state = nnx.split(models["transformer"])
    got = jax.jit(lambda s, x, t, e: nnx.merge(graph, s)(x, t, e))(
        state, jnp.asarray(latents), jnp.asarray(t), jnp.asarray(text))
    with torch.no_grad():
        want = pipe.transformer(torch.from_numpy(latents), torch.from_numpy(t),
                                torch.from_numpy(text)).sample
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=2e-5, rtol=0)


def test_same_seed_is_byte_identical_other_seed_redraws(tmp_path, wan_dir):
    from converters.safetensors_io import open_checkpoint

    same = tiny.build_tiny_pipeline(str(tmp_path / "same"), seed=0, family="wan")
    other = tiny.build_tiny_pipeline(str(tmp_path / "other"), seed=1, family="wan")
    files, same_files = _files(wan_dir), _files(same)
    assert sorted(files) == sorted(same_files)
    for path, data in files.items():
        assert data == same_files[path], path
    for name in tiny_wan.MODELS:
        saved = {k: v() for k, v in open_checkpoint(os.path.join(wan_dir, name)).items()}
        redrawn = {k: v() for k, v in open_checkpoint(os.path.join(other, name)).items()}
        assert sorted(saved) == sorted(redrawn)
        for key, value in saved.items():
            assert value.dtype == np.float32 and value.std() > 0, f"{name}/{key} is constant"
            assert not np.array_equal(value, redrawn[key]), f"{name}/{key} ignores the seed"


def test_failed_build_leaves_nothing_and_cli(tmp_path, monkeypatch, capsys):
    """A build that fails part-way (here: the second component's weights) leaves neither the
    target nor a temporary sibling; the CLI's --family picks the builder and refuses to clobber."""
    calls = []

    def failing(config, rng):
        calls.append(config.get("_class_name", "text"))
        if len(calls) == 2:
            raise OSError("disk full")
        return real(config, rng)

    real = tiny.random_weights
    monkeypatch.setattr(tiny, "random_weights", failing)
    with pytest.raises(OSError, match="disk full"):
        tiny.build_tiny_pipeline(str(tmp_path / "half"), family="wan")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(tiny, "random_weights", real)

    target = tmp_path / "cli"
    assert tiny_cli.main(["--family", "wan", str(target), "--seed", "2"]) == 0
    with open(target / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "WanPipeline"
    before = _files(str(target))
    capsys.readouterr()
    assert tiny_cli.main(["--family", "wan", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not empty" in err
    assert _files(str(target)) == before and os.listdir(tmp_path) == ["cli"]
    with pytest.raises(ValueError, match="unknown tiny pipeline family 'flux'"):
        tiny.build_tiny_pipeline(str(tmp_path / "x"), family="flux")
    with pytest.raises(SystemExit):  # the pretrained shapes pipeline is an SD3 one
        tiny_cli.main(["--family", "wan", "--pretrained", str(tmp_path / "p")])
    assert "SD3 shapes-world pipeline only" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["cli"]


def test_builder_runs_without_torch(tmp_path):
    """Hide torch from the import system (find_spec answers None, as transformers checks) and
    build the Wan pipeline."""
    import subprocess
    import sys

    code = f"""
import importlib.machinery, sys
class NoTorch(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            return None
        return super().find_spec(name, path, target)
sys.meta_path = [NoTorch if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from wfm_jax.families import tiny
tiny.build_tiny_pipeline({str(tmp_path / "p")!r}, family="wan")
assert "torch" not in sys.modules
"""
    root = REPO_ROOT
    env = dict(os.environ, PYTHONPATH=root)
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.isfile(tmp_path / "p" / "vae" / "diffusion_pytorch_model.safetensors")
