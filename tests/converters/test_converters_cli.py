"""`python -m converters to-jax | to-diffusers` on tiny random diffusers SD3 checkpoints."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open

from converters import jax_state
from converters.cli import main
from tests import _tiny_sd3 as sd3
from tests._support.paths import REPO_ROOT

WEIGHTS = "diffusion_pytorch_model.safetensors"


def _raw(directory):
    """key -> (dtype name, raw bytes, shape): compares tensors bit for bit, bf16 included."""
    out = {}
    with safe_open(os.path.join(directory, WEIGHTS), framework="numpy") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            t = f.get_tensor(key)
            out[key] = (piece.get_dtype(), tuple(piece.get_shape()), t.tobytes())
    return out


@pytest.fixture(scope="module")
def torch_model():
    return sd3.torch_model()


@pytest.fixture(scope="module")
def fp32_dir(torch_model, tmp_path_factory):
    return sd3.save(torch_model, tmp_path_factory.mktemp("sd3") / "fp32")


def _run(capsys, *argv):
    rc = main(list(map(str, argv)))
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_identical_and_loads_in_diffusers(torch_model, tmp_path, capsys, dtype):
    import torch
    from diffusers import SD3Transformer2DModel

    src = sd3.save(torch_model, tmp_path / "src", dtype)
    pipe = sd3.as_pipeline(src, tmp_path / "pipe")
    assert _run(capsys, "to-jax", pipe, tmp_path / "jax") == (0, "")
    stored = {dt for _, dt in jax_state.state_meta(str(tmp_path / "jax")).values()}
    assert {np.dtype(d).name for d in stored} == {dtype}  # bf16 is not blown up to fp32
    config = json.load(open(tmp_path / "jax" / "config.json"))
    assert config["_class_name"] == "SD3Transformer2DModel"
    assert _run(capsys, "to-diffusers", tmp_path / "jax", tmp_path / "back") == (0, "")
    want, got = _raw(src), _raw(tmp_path / "back")
    assert set(got) == set(want)
    for key in want:
        assert got[key] == want[key], key
    torch_dtype = getattr(torch, dtype)
    reloaded = SD3Transformer2DModel.from_pretrained(str(tmp_path / "back"),
                                                     torch_dtype=torch_dtype)
    original = SD3Transformer2DModel.from_pretrained(src, torch_dtype=torch_dtype)
    assert reloaded.dtype == torch_dtype
    ref = original.state_dict()
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, ref[key]), key
    assert sorted(os.listdir(tmp_path)) == ["back", "jax", "pipe", "src"]  # no temporaries


def test_dtype_option_casts(fp32_dir, tmp_path, capsys):
    assert _run(capsys, "to-jax", fp32_dir, tmp_path / "j", "--dtype", "bfloat16")[0] == 0
    assert {d.name for _, d in jax_state.state_meta(str(tmp_path / "j")).values()} == {"bfloat16"}
    rc, _ = _run(capsys, "to-diffusers", tmp_path / "j", tmp_path / "d", "--dtype", "float32")
    assert rc == 0
    assert {v[0] for v in _raw(tmp_path / "d").values()} == {"F32"}


def _edited(fp32_dir, tmp_path, edit):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(os.path.join(fp32_dir, WEIGHTS))
    edit(tensors)
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(tensors, str(bad / WEIGHTS))
    (bad / "config.json").write_text(open(os.path.join(fp32_dir, "config.json")).read())
    return bad


@pytest.mark.parametrize("edit, needles", [
    (lambda t: t.pop("transformer_blocks.1.attn.to_k.weight"),
     ["missing keys", "transformer_blocks.1.attn.to_k.weight"]),
    (lambda t: t.update({"transformer_blocks.1.attn.to_add_out.weight": np.zeros((32, 32))}),
     ["unexpected keys", "transformer_blocks.1.attn.to_add_out.weight"]),
    (lambda t: t.update({"proj_out.weight": np.zeros((16, 31), np.float32)}),
     ["wrong shape", "proj_out.weight"]),
])
def test_bad_checkpoint_one_line_naming_the_key_nothing_written(fp32_dir, tmp_path, capsys, edit,
                                                                needles):
    bad = _edited(fp32_dir, tmp_path, edit)
    rc, err = _run(capsys, "to-jax", bad, tmp_path / "out")
    assert rc == 1 and "\n" not in err
    for needle in needles:
        assert needle in err
    assert sorted(os.listdir(tmp_path)) == ["bad"]


def test_bad_directories(tmp_path, capsys, fp32_dir):
    rc, err = _run(capsys, "to-jax", tmp_path / "missing", tmp_path / "out")
    assert rc == 1 and "missing" in err and "\n" not in err
    rc, err = _run(capsys, "to-diffusers", fp32_dir, tmp_path / "out")  # not a wfm_jax state
    assert rc == 1 and "not a wfm_jax state dir" in err
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}))
    rc, err = _run(capsys, "to-jax", tmp_path / "pipe", tmp_path / "out")
    assert rc == 1 and "StableDiffusionPipeline" in err
    assert not (tmp_path / "out").exists()


def test_unsupported_class_exits_2_naming_it(tmp_path):
    unet = tmp_path / "unet"
    unet.mkdir()
    (unet / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    proc = subprocess.run([sys.executable, "-m", "converters", "to-jax", str(unet),
                           str(tmp_path / "out")], capture_output=True, text=True,
                          cwd=REPO_ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "UNet2DConditionModel" in lines[0]
    assert not (tmp_path / "out").exists()


def test_streaming_groups_and_sharded_safetensors(fp32_dir, tmp_path, monkeypatch):
    """to-jax hands orbax one group at a time; to-diffusers writes several shard files plus an
    index that diffusers loads and that to-jax reads back unchanged."""
    import orbax.checkpoint.experimental.v1 as ocp
    import torch
    from diffusers import SD3Transformer2DModel

    from converters import cli

    groups = []  # (tensor count, bytes) per partial save
    real_save = ocp.partial.save

    def spy(path, tree, **kw):
        leaves = jax_state.flatten(tree).values()
        groups.append((len(leaves), sum(x.nbytes for x in leaves)))
        return real_save(path, tree, **kw)

    monkeypatch.setattr(ocp.partial, "save", spy)
    limit = 128 << 10
    cli.to_jax(fp32_dir, str(tmp_path / "j"), group_bytes=limit)
    monkeypatch.undo()
    assert len(groups) > 2 and sum(n for n, _ in groups) == len(_raw(fp32_dir))
    assert all(size <= limit or n == 1 for n, size in groups)

    cli.to_diffusers(str(tmp_path / "j"), str(tmp_path / "d"), max_shard_bytes=64 << 10)
    files = os.listdir(tmp_path / "d")
    assert "diffusion_pytorch_model.safetensors.index.json" in files
    assert len([f for f in files if f.endswith(".safetensors")]) > 2
    reloaded = SD3Transformer2DModel.from_pretrained(str(tmp_path / "d")).state_dict()
    for key, value in SD3Transformer2DModel.from_pretrained(fp32_dir).state_dict().items():
        assert torch.equal(reloaded[key], value), key
    cli.to_jax(str(tmp_path / "d"), str(tmp_path / "j2"))
    first = jax_state.restore_state(str(tmp_path / "j"))
    for key, value in jax_state.restore_state(str(tmp_path / "j2")).items():
        assert value.tobytes() == first[key].tobytes(), key
