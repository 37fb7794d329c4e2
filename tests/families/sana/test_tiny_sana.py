"""The torch-free tiny SANA builders (`python -m wfm_jax.tiny --family sana|sana_video DIR`):
diffusers loads every component with no missing or unexpected key and generates with the
released defaults' instruction on, the configs are what diffusers/transformers would save, the
tokenizer is one diffusers' pipeline uses (BOS first, right padding, the instruction's words
whole), builds are seeded and byte-reproducible, `generate` runs on both, and the build needs
no torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests._support.paths import REPO_ROOT
from wfm_jax.cli import generate as gen
from wfm_jax.families import tiny
from wfm_jax.families.sana import tiny as tiny_sana
from wfm_jax.families.sana.pipeline import IMAGE_INSTRUCTION

PROMPTS = ["a cat sleeping", "a busy city street"]
FAMILIES = {"sana": ("SanaPipeline", tiny_sana.IMAGE_MODELS),
            "sana_video": ("SanaVideoPipeline", tiny_sana.VIDEO_MODELS)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def built(request, tmp_path_factory):
    family = request.param
    path = tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp(family) / "pipe"),
                                    family=family)
    import diffusers
    pipe = getattr(diffusers, FAMILIES[family][0]).from_pretrained(path)
    return family, path, pipe


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), root)] = f.read()
    return out


def test_components_load_with_no_missing_or_unexpected_keys(built):
    from diffusers import DPMSolverMultistepScheduler

    family, path, pipe = built
    assert type(pipe).__name__ == FAMILIES[family][0]
    for name, (_, cls_name, _) in FAMILIES[family][1].items():
        cls = type(getattr(pipe, name))
        assert cls.__name__ == cls_name
        _, info = cls.from_pretrained(path, subfolder=name, output_loading_info=True)
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info.get(kind), f"{name}: {kind} {info[kind]}"
    s = pipe.scheduler.config
    assert isinstance(pipe.scheduler, DPMSolverMultistepScheduler)
    assert (s.algorithm_type, s.solver_type, s.prediction_type, s.use_flow_sigmas,
            s.final_sigmas_type, s.flow_shift) == (
        "dpmsolver++", "midpoint", "flow_prediction", True, "zero",
        tiny_sana.VIDEO_SHIFT if family == "sana_video" else tiny_sana.IMAGE_SHIFT)
    assert pipe.text_encoder.config.vocab_size == len(pipe.tokenizer)


def test_tokenizer_is_what_the_pipeline_needs(built):
    """BOS first (encode_prompt keeps token 0), no EOS, the instruction's words one token each
    (the default instruction fits the tiny Gemma2's positions with 300 prompt tokens)."""
    _, _, pipe = built
    tok = pipe.tokenizer
    ids = tok.encode("a cat sleeping")
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids and len(ids) == 4
    assert tok.padding_side == "right"
    chi = len(tok.encode("\n".join(IMAGE_INSTRUCTION)))
    assert chi < 300 and chi + 300 - 2 <= tiny_sana.GEMMA_POSITIONS
    assert tok.unk_token_id not in tok.encode("\n".join(IMAGE_INSTRUCTION))


def test_configs_are_what_diffusers_and_transformers_write(built):
    import diffusers

    family, path, pipe = built
    for name, file in (("transformer", "config.json"), ("vae", "config.json"),
                       ("scheduler", "scheduler_config.json")):
        with open(os.path.join(path, name, file)) as f:
            written = f.read()
        cls = getattr(diffusers, json.loads(written)["_class_name"])
        config = {k: v for k, v in json.loads(written).items() if not k.startswith("_")}
        assert cls(**config).to_json_string() == written, name
    with open(os.path.join(path, "text_encoder", "config.json")) as f:
        assert json.loads(pipe.text_encoder.config.to_json_string(use_diff=True)) == json.load(f)
    with open(os.path.join(path, "model_index.json")) as f:
        index = json.load(f)
    saved = {k: list(v) if isinstance(v, tuple) else v for k, v in dict(pipe.config).items()
             if not k.startswith("_")}
    # the release names GemmaTokenizerFast, which transformers 5 aliases to GemmaTokenizer
    import transformers
    assert transformers.GemmaTokenizerFast is type(pipe.tokenizer)
    saved["tokenizer"] = index["tokenizer"]
    assert saved == {k: v for k, v in index.items() if not k.startswith("_")}


def test_diffusers_generates_with_the_default_instruction(built):
    family, _, pipe = built
    kw = dict(frames=tiny_sana.FRAMES) if family == "sana_video" else {}
    with torch.no_grad():
        out = pipe(PROMPTS, height=tiny_sana.HEIGHT, width=tiny_sana.WIDTH,
                   num_inference_steps=2, guidance_scale=4.5, use_resolution_binning=False,
                   generator=torch.Generator().manual_seed(0), output_type="np", **kw)
    pixels = out.frames if family == "sana_video" else out.images
    size = (tiny_sana.HEIGHT, tiny_sana.WIDTH, 3)
    assert pixels.shape == ((2, tiny_sana.FRAMES) + size if kw else (2,) + size)
    assert np.isfinite(pixels).all() and pixels.min() >= 0 and pixels.max() <= 1
    assert all(p.std() > 1e-2 for p in pixels)  # pictures, not a flat colour
    assert np.abs(pixels[0] - pixels[1]).max() > 1e-2  # the prompt reaches the pixels


@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_generate_cli_runs_on_the_family(built, tmp_path, capsys):
    family, path, _ = built
    out = tmp_path / ("clip.mp4" if family == "sana_video" else "img.png")
    args = ["--model", path, "--prompt", "a cat", "--steps", "2", "--height", "32", "--width",
            "32", "--out", str(out), "--save-array", str(tmp_path / "x.npy")]
    if family == "sana_video":
        args += ["--frames", "5"]
    assert gen.main(args) == 0, capsys.readouterr().err
    pixels = np.load(tmp_path / "x.npy")
    assert pixels.shape == ((1, 5, 32, 32, 3) if family == "sana_video" else (1, 32, 32, 3))
    assert out.is_file()
    assert gen.main(args[:-4] + ["--height", "48"]) == 2
    assert "multiples of 32; got 48x32" in capsys.readouterr().err


def test_same_seed_is_byte_identical_other_seed_redraws(built, tmp_path):
    from converters.safetensors_io import open_checkpoint

    family, path, _ = built
    same = tiny.build_tiny_pipeline(str(tmp_path / "same"), seed=0, family=family)
    other = tiny.build_tiny_pipeline(str(tmp_path / "other"), seed=1, family=family)
    files, same_files = _files(path), _files(same)
    assert sorted(files) == sorted(same_files)
    for name, data in files.items():
        assert data == same_files[name], name
    for name in FAMILIES[family][1]:
        saved = {k: v() for k, v in open_checkpoint(os.path.join(path, name)).items()}
        redrawn = {k: v() for k, v in open_checkpoint(os.path.join(other, name)).items()}
        assert sorted(saved) == sorted(redrawn)
        for key, value in saved.items():
            assert not np.array_equal(value, redrawn[key]), f"{name}/{key} ignores the seed"


def test_cli_and_torch_free_build(tmp_path):
    """`python -m wfm_jax.tiny --family sana_video` in a process where torch cannot be imported."""
    code = f"""
import importlib.machinery, sys
class NoTorch(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            return None
        return super().find_spec(name, path, target)
sys.meta_path = [NoTorch if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from wfm_jax.cli import tiny as tiny_cli
assert tiny_cli.main(["--family", "sana", {str(tmp_path / "i")!r}]) == 0
assert tiny_cli.main(["--family", "sana_video", {str(tmp_path / "v")!r}]) == 0
assert "torch" not in sys.modules
"""
    root = REPO_ROOT
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, PYTHONPATH=root))
    assert result.returncode == 0, result.stderr[-2000:]
    for name, cls in (("i", "SanaPipeline"), ("v", "SanaVideoPipeline")):
        with open(tmp_path / name / "model_index.json") as f:
            assert json.load(f)["_class_name"] == cls
