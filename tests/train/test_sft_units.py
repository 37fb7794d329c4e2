"""SFT building blocks: LoRA targeting / init / peft key format and parity with diffusers'
`load_lora_adapter` on an MMDiT-X transformer, sharded TrainState layout, the shapes dataset,
and `python -m wfm_jax.main` failing with one line on bad input."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from converters.loading import load_model
from tests import _tiny_sd3
from wfm_jax.cli import main as wmain
from wfm_jax.config.recipe import load_config
from wfm_jax.models import lora
from wfm_jax.train import setup as setup_lib
from wfm_jax.train.export import LORA_WEIGHT_NAME, export_lora

TARGETS = ("attn.to_q", "attn.to_out.0", "attn.add_k_proj", "attn.to_add_out", "attn2.to_v")


@pytest.fixture(scope="module")
def torch_transformer():
    return _tiny_sd3.torch_model(seed=3)


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory, torch_transformer):
    return _tiny_sd3.save(torch_transformer, str(tmp_path_factory.mktemp("sd3") / "transformer"))


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("tiny_assets")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes"), count=8, size=32, seed=1))


def _model(transformer_dir):
    return load_model(transformer_dir)[0]


# ----------------------------------------------------------------------------- LoRA

def test_targets_match_like_peft(transformer_dir):
    model = _model(transformer_dir)
    paths = lora.attach_lora(model, TARGETS, r=4, lora_alpha=8)
    # the last block is context_pre_only (no to_add_out); only block 0 has attn2
    assert paths == sorted([
        "transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_q",
        "transformer_blocks.0.attn.to_out.0", "transformer_blocks.1.attn.to_out.0",
        "transformer_blocks.0.attn.add_k_proj", "transformer_blocks.1.attn.add_k_proj",
        "transformer_blocks.0.attn.to_add_out", "transformer_blocks.0.attn2.to_v"])
    assert lora.lora_paths(model) == paths
    # "attn.to_q" must not catch attn2.to_q (peft matches on a "." boundary)
    assert model.transformer_blocks[0].attn2.to_q.lora_a is None


def test_lora_init_and_errors(transformer_dir):
    model = _model(transformer_dir)
    lora.attach_lora(model, ["to_q"], r=16, lora_alpha=8, seed=1)
    layer = model.transformer_blocks[0].attn.to_q
    a, b = np.asarray(layer.lora_a[...]), np.asarray(layer.lora_b[...])
    assert a.shape == (32, 16) and b.shape == (16, 32) and not b.any()
    assert abs(a.std() - 1 / 16) < 0.2 / 16  # peft "gaussian": std 1/r
    assert layer.lora_scale == 0.5
    with pytest.raises(lora.LoraError, match=r"\['attn.to_qq'\] match no linear layer"):
        lora.attach_lora(_model(transformer_dir), ["attn.to_q", "attn.to_qq"], 4, 4)
    with pytest.raises(lora.LoraError, match="init_lora_weights='zeros'"):
        lora.attach_lora(_model(transformer_dir), ["attn.to_q"], 4, 4, init="zeros")


def test_diffusers_keys_round_trip():
    flat = {"transformer_blocks.0.attn.to_out.0.lora_a": np.ones((32, 4), np.float32),
            "transformer_blocks.0.attn.to_out.0.lora_b": np.arange(12.0).reshape(4, 3)}
    sd = lora.to_diffusers(flat)
    assert sd["transformer.transformer_blocks.0.attn.to_out.0.lora_A.weight"].shape == (4, 32)
    assert sd["transformer.transformer_blocks.0.attn.to_out.0.lora_B.weight"].shape == (3, 4)
    back = lora.from_diffusers(sd)
    assert set(back) == set(flat) and all(np.array_equal(back[k], flat[k]) for k in flat)


def test_lora_export_matches_diffusers_adapter(tmp_path, transformer_dir, torch_transformer):
    """Nonzero random A and B, exported and loaded by diffusers (peft), give the same velocity."""
    import copy

    import torch
    model = _model(transformer_dir)
    lora.attach_lora(model, TARGETS, r=4, lora_alpha=12)
    rng = np.random.default_rng(0)
    for _, var in nnx.state(model, nnx.LoRAParam).flat_state():
        var[...] = jnp.asarray(rng.standard_normal(var.shape) * 0.2, jnp.float32)
    _, params, _ = nnx.split(model, nnx.LoRAParam, ...)
    adapter = lora.adapter_config(4, 12, TARGETS)
    export_lora(params, adapter, str(tmp_path / "step_1"))
    lora_dir = tmp_path / "step_1" / "lora"
    assert json.loads((lora_dir / "adapter_config.json").read_text())["lora_alpha"] == 12

    reference = copy.deepcopy(torch_transformer)
    reference.load_lora_adapter(str(lora_dir), weight_name=LORA_WEIGHT_NAME, prefix="transformer",
                                adapter_name="default")
    x, ctx, pooled, t = _tiny_sd3.inputs(batch=2)
    args = dict(hidden_states=torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(ctx),
                pooled_projections=torch.from_numpy(pooled), timestep=torch.from_numpy(t))
    with torch.no_grad():
        want = reference(**args).sample.numpy()
        base = torch_transformer(**args).sample.numpy()
    got = np.asarray(model(x, ctx, pooled, t))
    assert np.abs(want - base).max() > 1e-2  # the adapter changes the output
    np.testing.assert_allclose(got, want, atol=1e-4)


# ----------------------------------------------------------------------------- setup

def _config(tiny_assets, tmp_path, overrides=()):
    pipe, shapes = tiny_assets
    return load_config("configs/tiny_sft.py", [
        ("policy.model_name_or_path", pipe), ("train.train_policy.dataset.local_dir", shapes),
        ("train.output_dir", str(tmp_path / "out")), *overrides])


@pytest.mark.parametrize("use_lora", [False, True])
def test_state_is_sharded_like_params(tiny_assets, tmp_path, use_lora):
    config = _config(tiny_assets, tmp_path, [("policy.lora.enable", str(use_lora)),
                                             ("policy.parallelism.data", "4"),
                                             ("policy.parallelism.fsdp", "2")])
    s = setup_lib.build(config, aux_fn=lambda p: {"old": p})
    try:
        specs = lambda tree: [x.sharding.spec for x in jax.tree.leaves(tree)]
        params = specs(s.state.params)
        assert any("fsdp" in str(p) for p in params)  # FSDP really splits something
        mu = s.state.opt_state[1][0].mu  # chain(clip, adamw(scale_by_adam, ...))
        assert specs(mu) == params == specs(s.state.ema) == specs(s.state.aux["old"])
        assert [x.spec for x in jax.tree.leaves(s.shardings.params)] == params
        kinds = {type(v) for _, v in s.state.params.flat_state()}
        assert kinds == ({nnx.LoRAParam} if use_lora else {nnx.Param})
        assert s.start_step == 0 and int(s.state.step) == 0
    finally:
        s.close()


def test_checkpoints_in_the_way(tiny_assets, tmp_path):
    config = _config(tiny_assets, tmp_path, [("policy.lora.enable", "True")])  # small state
    s = setup_lib.build(config)
    s.save(2, force=True)
    s.close()
    with pytest.raises(setup_lib.SetupError, match=r"already holds checkpoints \(latest step 2\)"):
        setup_lib.build(config)
    with pytest.raises(setup_lib.SetupError, match=r"already holds checkpoints \(latest step 2\)"):
        setup_lib.check_fresh_output(config)  # what main checks before writing config.json


# ----------------------------------------------------------------------------- data

def test_shapes_dataset(tmp_path):
    from wfm_jax.data.paired import paired_loader
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    a = build_shapes_dataset(str(tmp_path / "a"), count=6, size=24, seed=3)
    b = build_shapes_dataset(str(tmp_path / "b"), count=6, size=24, seed=3)
    names = sorted(os.listdir(a))
    assert len(names) == 12 and names == sorted(os.listdir(b))
    assert all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read()
               for n in names)
    with paired_loader(a, 6, (24, 24), shuffle=False) as loader:
        batch = next(loader)
    assert batch["pixels"].shape == (6, 24, 24, 3)
    assert batch["pixels"].dtype == np.uint8 and batch["pixels"].max() > 0
    assert batch["prompt"][0] == json.load(open(os.path.join(a, "0000.json")))["prompt"]
    with pytest.raises(FileExistsError):
        build_shapes_dataset(a)


# ----------------------------------------------------------------------------- main: bad input

def _main(capsys, *args):
    rc = wmain.main(["--config", "configs/tiny_sft.py", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, [line for line in err if line.startswith("error:")], err


def test_main_typo_key(capsys, tmp_path):
    rc, errors, err = _main(capsys, "--config.train.max_step=3",
                            f"--config.train.output_dir={tmp_path}")
    assert rc == 2 and errors == ["error: unknown key 'train.max_step'; did you mean 'max_steps'?"]
    assert not any("Traceback" in line for line in err)


def test_main_missing_model_dir(capsys, tmp_path, tiny_assets):
    rc, errors, _ = _main(capsys, f"--config.train.output_dir={tmp_path / 'o'}",
                          f"--config.policy.model_name_or_path={tmp_path / 'nope'}",
                          "--config.policy.build_tiny=False",
                          f"--config.train.train_policy.dataset.local_dir={tiny_assets[1]}")
    assert rc == 2 and len(errors) == 1
    assert "model directory not found" in errors[0]
    assert "--config.policy.model_name_or_path" in errors[0]
    # config.json describes a run that started; this one never did
    assert not os.path.exists(tmp_path / "o" / "config.json")


def test_main_mistyped_model_path_builds_nothing(capsys, tmp_path, tiny_assets):
    typo = tmp_path / "tiny_sd33"
    rc, errors, _ = _main(capsys, f"--config.train.output_dir={tmp_path / 'o'}",
                          f"--config.policy.model_name_or_path={typo}",
                          f"--config.train.train_policy.dataset.local_dir={tiny_assets[1]}",
                          "--config.train.max_steps=1")
    assert rc == 2 and len(errors) == 1 and "model directory not found" in errors[0]
    assert not typo.exists()


def test_building_the_tiny_pipeline_is_said(capsys, tmp_path):
    config = load_config("configs/tiny_sft.py", [
        ("policy.model_name_or_path", str(tmp_path / "pipe")), ("policy.build_tiny", "True"),
        ("train.train_policy.dataset.local_dir", str(tmp_path / "shapes"))])
    setup_lib.ensure_tiny_assets(config)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"building the tiny random SD3 pipeline (policy.build_tiny) at "
                   f"{tmp_path / 'pipe'} (it does not exist yet)"]
    assert os.path.isdir(tmp_path / "pipe" / "transformer")
    setup_lib.ensure_tiny_assets(config)  # present now: built once, said once
    assert capsys.readouterr().out == ""


def _copy_dataset(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_main_bad_data(capsys, tmp_path, tiny_assets):
    pipe, shapes = tiny_assets
    common = [f"--config.policy.model_name_or_path={pipe}", "--config.data.shuffle=False",
              "--config.train.train_policy.dataset.build_tiny=False", "--config.train.max_steps=1"]
    rc, errors, _ = _main(capsys, *common, f"--config.train.output_dir={tmp_path / 'o1'}",
                          f"--config.train.train_policy.dataset.local_dir={tmp_path / 'none'}")
    assert rc == 2 and "dataset dir not found" in errors[0]

    no_prompt = _copy_dataset(shapes, str(tmp_path / "no_prompt"))
    with open(os.path.join(no_prompt, "0003.json"), "w") as f:
        json.dump({"caption": "x"}, f)
    rc, errors, _ = _main(capsys, *common, f"--config.train.output_dir={tmp_path / 'o2'}",
                          f"--config.train.train_policy.dataset.local_dir={no_prompt}")
    assert rc == 2 and errors == [f'error: {os.path.join(no_prompt, "0003.json")} has no "prompt"']

    corrupt = _copy_dataset(shapes, str(tmp_path / "corrupt"))
    with open(os.path.join(corrupt, "0002.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n not really")
    rc, errors, _ = _main(capsys, *common, f"--config.train.output_dir={tmp_path / 'o3'}",
                          f"--config.train.train_policy.dataset.local_dir={corrupt}")
    assert rc == 2 and len(errors) == 1
    assert f"corrupt image {os.path.join(corrupt, '0002.png')}" in errors[0]
    assert not os.path.exists(tmp_path / "o3" / "checkpoints" / "1")
