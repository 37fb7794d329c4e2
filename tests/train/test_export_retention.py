"""Full fine-tune exports: the unchanged pipeline components are shared (hard links) with the
source instead of copied per step, and only the newest train.ckpt.export_max_keep step dirs are
kept (None: as max_keep; 0: every one)."""
from __future__ import annotations

import os
import types

import pytest

from converters.loading import export_diffusers, load_model
from tests._support.paths import REPO_ROOT
from wfm_jax.config.recipe import load_config
from wfm_jax.train.export import export_step

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def pipe_and_model(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    pipe = build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)
    return pipe, load_model(pipe)


def _setup(pipe_and_model, out, **ckpt):
    """What export_step reads of a full fine-tune's TrainSetup."""
    pipe, (model, transformer_config) = pipe_and_model
    config = load_config(f"{ROOT}/configs/tiny_sft.py", [("train.output_dir", str(out))] + [
        (f"train.ckpt.{k}", str(v)) for k, v in ckpt.items()])
    return types.SimpleNamespace(
        config=config, lora=False, state=types.SimpleNamespace(ema=None, params=None),
        merge=lambda params: model,
        pipe=types.SimpleNamespace(
            transformer_config=transformer_config, directory=pipe,
            # the family's default (PipelineFamily.export_trainable)
            export_trainable=lambda module, directory: export_diffusers(module, transformer_config,
                                                                        directory)))


def _exported(out):
    return sorted(os.listdir(out / "safetensors"))


@pytest.mark.parametrize("ckpt, kept", [
    (dict(max_keep=2), ["step_2", "step_3"]),                       # follows max_keep
    (dict(max_keep=5, export_max_keep=1), ["step_3"]),
    (dict(max_keep=1, export_max_keep=0), ["step_1", "step_2", "step_3"]),  # keep every one
])
def test_exports_are_pruned(pipe_and_model, tmp_path, capsys, ckpt, kept):
    setup = _setup(pipe_and_model, tmp_path, **ckpt)
    for step in (1, 2, 3):
        export_step(setup, step)
    assert _exported(tmp_path) == kept
    removed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("removed export")]
    assert len(removed) == 3 - len(kept)
    # what is left still loads: every file of its pipeline is in place
    assert os.path.isfile(tmp_path / "safetensors" / kept[0] / "model_index.json")


def test_unchanged_components_are_shared_not_copied(pipe_and_model, tmp_path):
    pipe = pipe_and_model[0]
    setup = _setup(pipe_and_model, tmp_path, export_max_keep=0)
    export_step(setup, 1)
    export_step(setup, 2)
    step1, step2 = (tmp_path / "safetensors" / f"step_{s}" for s in (1, 2))
    shared = [os.path.join(d, f) for d in ("text_encoder", "text_encoder_3", "vae")
              for f in os.listdir(os.path.join(pipe, d))]
    assert shared
    for rel in shared:
        source = os.stat(os.path.join(pipe, rel))
        assert os.stat(step1 / rel).st_ino == source.st_ino == os.stat(step2 / rel).st_ino, rel
    written = [f for f in os.listdir(step1 / "transformer") if f.endswith(".safetensors")]
    assert written and all(
        os.stat(step1 / "transformer" / f).st_ino != os.stat(step2 / "transformer" / f).st_ino
        for f in written)  # the trained weights are written per step
