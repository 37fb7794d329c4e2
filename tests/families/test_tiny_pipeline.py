"""The torch-free tiny SD3 pipeline builder: diffusers/transformers load and run what it writes,
with the files their own save_pretrained would write; offline and seeded; wfm_jax loads it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from converters.safetensors_io import open_checkpoint
from tests._support.paths import REPO_ROOT
from wfm_jax.cli import tiny as tiny_cli
from wfm_jax.families import tiny

PROMPTS = ["a photo of the cat", "a red dog on the blue sofa"]
WEIGHTED = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)


@pytest.fixture(scope="module")
def pipe(tiny_dir):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(tiny_dir)


def _model_classes():
    import diffusers
    import transformers

    return {name: getattr(transformers if lib == "transformers" else diffusers, cls)
            for name, (lib, cls, _) in tiny.MODELS.items()}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
    return out


def _saved_weights(tiny_dir: str, name: str) -> dict[str, np.ndarray]:
    return {k: v() for k, v in open_checkpoint(os.path.join(tiny_dir, name)).items()}


def test_components_load_with_no_missing_or_unexpected_keys(tiny_dir):
    for name, cls in _model_classes().items():
        _, info = cls.from_pretrained(tiny_dir, subfolder=name, output_loading_info=True)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info[kind], f"{name}: {kind} {info[kind]}"


def test_configs_are_what_diffusers_and_transformers_write(tiny_dir, pipe):
    """Each hand-written config.json is byte for byte what the library's own save writes for a
    model built from it (so no argument is missing or drifts from the class defaults)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    for name, cls, file in (("transformer", SD3Transformer2DModel, "config.json"),
                            ("vae", AutoencoderKL, "config.json"),
                            ("scheduler", FlowMatchEulerDiscreteScheduler,
                             "scheduler_config.json")):
        written = _read(os.path.join(tiny_dir, name, file))
        config = {k: v for k, v in json.loads(written).items() if not k.startswith("_")}
        assert json.loads(written)["_class_name"] == cls.__name__
        assert cls(**config).to_json_string() == written, name
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        config = getattr(pipe, name).config
        with_dtype = json.loads(config.to_json_string(use_diff=True))
        assert with_dtype == json.loads(_read(os.path.join(tiny_dir, name, "config.json"))), name
    index = json.loads(_read(os.path.join(tiny_dir, "model_index.json")))
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    for name in [*tiny.MODELS, *tiny.OTHERS]:
        assert index[name] == [getattr(pipe, name).__module__.split(".")[0],
                               type(getattr(pipe, name)).__name__], name


def test_diffusers_runs_two_steps(pipe):
    images = pipe(PROMPTS, num_inference_steps=2, height=32, width=32, guidance_scale=4.5,
                  generator=torch.Generator().manual_seed(0), output_type="np").images
    assert images.shape == (2, 32, 32, 3)
    assert np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    for image in images:  # random weights must still give a picture, not a flat colour
        assert image.std() > 1e-2
    # the prompt reaches the pixels through all three encoders and the transformer
    assert np.abs(images[0] - images[1]).max() > 1e-2


def test_tokenizers_match_encoder_configs(pipe):
    for tok, enc in ((pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)):
        assert tok.model_max_length == enc.config.max_position_embeddings == tiny.CLIP_MAX_LENGTH
        assert (tok.bos_token_id, tok.eos_token_id) == (enc.config.bos_token_id,
                                                        enc.config.eos_token_id)
        assert len(tok) == enc.config.vocab_size
        ids = tok(PROMPTS[0], padding="max_length", max_length=77).input_ids
        n = ids.index(tok.eos_token_id)
        assert ids[0] == tok.bos_token_id and set(ids[n + 1:]) == {tok.pad_token_id}
        assert tok.decode(ids[1:n]) == PROMPTS[0]
    assert pipe.tokenizer_2.pad_token == "!"  # as SD3's CLIP-G: padding differs from EOS
    t5 = pipe.tokenizer_3(PROMPTS[1]).input_ids
    assert t5[-1] == pipe.tokenizer_3.eos_token_id and pipe.tokenizer_3.unk_token_id not in t5
    assert pipe.tokenizer_3.decode(t5, skip_special_tokens=True) == PROMPTS[1]
    assert pipe.text_encoder_3.config.vocab_size >= len(pipe.tokenizer_3)


def test_weight_scales_follow_torch_default_init(pipe):
    """Linear/conv weights lie within torch's default bound 1/sqrt(fan_in) and fill it (a wrong
    fan-in axis or a missing scale fails); norms are 1 + noise, never constant."""
    for name in WEIGHTED:
        for mod_name, module in getattr(pipe, name).named_modules():
            where = f"{name}/{mod_name}"
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
                w = module.weight.detach().numpy()
                bound = 1 / np.sqrt(w[0].size)
                assert np.abs(w).max() <= bound * (1 + 1e-6), where
                assert w.std() > 0.5 * bound / np.sqrt(3), where  # uniform std is bound/sqrt(3)
            elif (isinstance(module, (torch.nn.LayerNorm, torch.nn.GroupNorm))
                  and module.weight is not None):  # SD3's adaptive norms have no affine part
                w = module.weight.detach().numpy()
                assert w.std() > 0 and abs(w.mean() - 1) < 0.2, where


def test_weights_deterministic_in_seed_and_never_constant(tmp_path, tiny_dir, pipe):
    """Same seed: every file byte-identical. Other seed: every weight differs except the
    non-random buffers, which equal what diffusers computes itself."""
    same = tiny.build_tiny_pipeline(str(tmp_path / "same"), seed=0)
    other = tiny.build_tiny_pipeline(str(tmp_path / "other"), seed=1)
    files, same_files = _files(tiny_dir), _files(same)
    assert sorted(files) == sorted(same_files)
    for path, data in files.items():
        assert data == same_files[path], path
    for name in WEIGHTED:
        buffers = {k: v.numpy() for k, v in getattr(pipe, name).named_buffers()}
        saved, redrawn = _saved_weights(tiny_dir, name), _saved_weights(other, name)
        assert sorted(saved) == sorted(redrawn)
        for key, value in saved.items():
            assert value.dtype == np.float32 and (value.size == 1 or value.std() > 0), key
            if key in buffers:
                np.testing.assert_allclose(value, buffers[key], atol=1e-6, err_msg=key)
                np.testing.assert_array_equal(value, redrawn[key], err_msg=key)
            else:
                assert not np.array_equal(value, redrawn[key]), f"{name}/{key} ignores the seed"
    assert {os.path.basename(p) for p in (same, other)} == {"same", "other"}


def test_jax_pipeline_loads_and_matches_diffusers(tiny_dir, pipe):
    """The JAX pipeline loads the builder's files and encodes prompts and predicts velocities as
    diffusers does on the same files (CLIP-G pads with '!', so pooling must find the first EOS)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from wfm_jax.families.sd3.pipeline import SD3Pipeline, encode_tokens

    jax_pipe = SD3Pipeline.load(tiny_dir)
    ids = jax_pipe.tokenize(PROMPTS, max_sequence_length=16)
    graph, state = nnx.split(jax_pipe.text_encoders)  # jit: eager dispatch is slower here
    embeds, pooled = jax.jit(lambda s, i: encode_tokens(nnx.merge(graph, s), i, tiny.T5_WIDTH,
                                                        16))(state, ids)
    with torch.no_grad():
        want, _, want_pooled, _ = pipe.encode_prompt(PROMPTS, PROMPTS, PROMPTS,
                                                     do_classifier_free_guidance=False,
                                                     max_sequence_length=16)
    np.testing.assert_allclose(np.asarray(embeds), want.numpy(), atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(pooled), want_pooled.numpy(), atol=2e-5, rtol=0)
    latents = np.random.default_rng(0).standard_normal((2, 4, 4, 4), np.float32)
    t = np.array([250.0, 750.0], np.float32)
    graph, state = nnx.split(jax_pipe.transformer)
    got = jax.jit(lambda s, x, e, p, t: nnx.merge(graph, s)(x, e, p, t))(
        state, jnp.asarray(latents), embeds, pooled, jnp.asarray(t))
    with torch.no_grad():
        ref = pipe.transformer(torch.from_numpy(latents), encoder_hidden_states=want,
                               pooled_projections=want_pooled,
                               timestep=torch.from_numpy(t)).sample
    np.testing.assert_allclose(np.asarray(got), ref.numpy(), atol=2e-5, rtol=0)


def test_cli_writes_and_refuses_to_clobber(tmp_path, capsys):
    target = tmp_path / "cli_pipe"
    assert tiny_cli.main([str(target), "--seed", "3"]) == 0
    with open(target / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "StableDiffusion3Pipeline"
    before = sorted(os.listdir(target))
    capsys.readouterr()
    assert tiny_cli.main([str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not empty" in err and str(target) in err
    assert sorted(os.listdir(target)) == before
    assert sorted(os.listdir(tmp_path)) == ["cli_pipe"]  # no temporary directory left behind
    assert tiny_cli.main([str(tmp_path / "neg"), "--seed", "-1"]) == 2
    assert "seed" in capsys.readouterr().err and sorted(os.listdir(tmp_path)) == ["cli_pipe"]


def test_builder_runs_without_torch(tmp_path):
    """The quick start must work where torch is not installed: hide it from the import system
    (find_spec answers None, as transformers checks) and build a pipeline."""
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
tiny.build_tiny_pipeline({str(tmp_path / "p")!r})
assert "torch" not in sys.modules
"""
    root = REPO_ROOT
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.isfile(tmp_path / "p" / "transformer" / "diffusion_pytorch_model.safetensors")
