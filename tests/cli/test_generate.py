"""End to end: `python -m wfm_jax.generate` against diffusers' StableDiffusion3Pipeline on the tiny
pipeline, from the same initial latents (fp32, <= 1e-4), with and without CFG."""
from __future__ import annotations

import functools
import json
import operator
import os

import numpy as np
import pytest

from wfm_jax.cli import generate

PROMPTS = ["a red cube on a table", "two dogs"]
H = W = 32
STEPS = 3
MAX_LEN = 16


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)


@pytest.fixture(scope="module")
def torch_pipe(tiny_dir):
    from diffusers import StableDiffusion3Pipeline
    return StableDiffusion3Pipeline.from_pretrained(tiny_dir)


def _latents(torch_pipe, seed=0):
    channels = torch_pipe.transformer.config.in_channels
    factor = torch_pipe.vae_scale_factor
    rng = np.random.default_rng(seed)
    return rng.standard_normal((len(PROMPTS), channels, H // factor, W // factor)).astype(np.float32)


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_generate_matches_diffusers(tmp_path, tiny_dir, torch_pipe, guidance):
    import torch
    latents = _latents(torch_pipe)
    np.save(tmp_path / "init.npy", latents)
    with torch.no_grad():
        want = torch_pipe(PROMPTS, latents=torch.from_numpy(latents), num_inference_steps=STEPS,
                          guidance_scale=guidance, height=H, width=W, output_type="np",
                          max_sequence_length=MAX_LEN).images
    rc = generate.main(["--model", tiny_dir, *functools.reduce(operator.iadd, [["--prompt", p] for p in PROMPTS], []),
                        "--steps", str(STEPS), "--guidance", str(guidance), "--height", str(H),
                        "--width", str(W), "--latents", str(tmp_path / "init.npy"),
                        "--max-sequence-length", str(MAX_LEN), "--out", str(tmp_path / "g.png"),
                        "--save-array", str(tmp_path / "g.npy")])
    assert rc == 0
    got = np.load(tmp_path / "g.npy")
    assert got.shape == want.shape == (len(PROMPTS), H, W, 3)
    assert np.abs(got - want).max() <= 1e-4
    assert got.std() > 1e-3  # a non-constant image: the comparison means something

    from PIL import Image
    grid = Image.open(tmp_path / "g.png")
    assert grid.size == (2 * W, H)  # two prompts side by side


def test_generate_bad_inputs(tmp_path, tiny_dir, capsys):
    base = ["--prompt", "x", "--steps", "1", "--out", str(tmp_path / "o.png")]
    assert generate.main(["--model", str(tmp_path / "nope"), *base]) == 2
    assert "no such pipeline directory" in capsys.readouterr().err

    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    assert generate.main(["--model", str(other), *base]) == 2
    assert "FluxPipeline" in capsys.readouterr().err

    import shutil
    partial = tmp_path / "partial"
    shutil.copytree(tiny_dir, partial)
    shutil.rmtree(partial / "vae")
    assert generate.main(["--model", str(partial), *base]) == 2
    assert "'vae'" in capsys.readouterr().err

    assert generate.main(["--model", tiny_dir, *base, "--height", "33", "--width", "32"]) == 2
    assert "multiples of" in capsys.readouterr().err

    np.save(tmp_path / "bad.npy", np.zeros((1, 4, 3, 3), np.float32))
    assert generate.main(["--model", tiny_dir, *base, "--height", "32", "--width", "32",
                          "--latents", str(tmp_path / "bad.npy")]) == 2
    assert "expected" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o.png")


def test_size_beyond_the_position_table_is_one_line_before_any_work(tmp_path, tiny_dir, capsys,
                                                                    monkeypatch):
    # the README's 512x512 failed deep inside the transformer after encoding the prompts
    def never(*a, **k):
        raise AssertionError("encoded prompts for a size the model cannot take")

    from wfm_jax.programs import sample
    monkeypatch.setattr(sample, "encode_prompts", never)
    rc = generate.main(["--model", tiny_dir, "--prompt", "x", "--height", "512", "--width", "512",
                        "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [
        "error: 512x512 is larger than this model takes: its position embedding covers 96x96 "
        "patches, at most 192x192 pixels (patch size 2 x VAE factor 1)"]
    assert not (tmp_path / "x.png").exists()
