"""Nothing compiles again after the first steps: every train jit has explicit shardings, so the
state an update returns is laid out exactly as it went in. Four steps of each tiny recipe on an
8-device FSDP mesh, a checkpoint and an export at steps 2 and 4, validation every step: once
step 2 has run every kind of work once, steps 3 and 4 must compile nothing (XLA backend
compilations counted through jax.monitoring, and hits of a persistent compilation cache, as
tests/_resume.py turns on: a program fetched from such a cache was still built again)."""
from __future__ import annotations

import os

import pytest

from tests._support.compiles import CompileCounter
from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import load_config

pytestmark = pytest.mark.slow

CONFIGS = CONFIGS


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("assets")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes"), count=16, size=16, seed=0))


def _config(recipe, assets, out_dir, **extra):
    pipe, shapes = assets
    values = {"policy.model_name_or_path": pipe, "train.output_dir": str(out_dir),
              "policy.parallelism.data": 1, "policy.parallelism.fsdp": 8,
              "policy.diffusers.inference_size": "(16, 16)", "train.max_steps": 4,
              "train.ckpt.save_freq": 2, "train.ckpt.export_safetensors": True, **extra}
    if recipe in ("tiny_sft.py", "tiny_ddrl.py"):
        values["train.train_policy.dataset.local_dir"] = shapes
    return load_config(os.path.join(CONFIGS, recipe), [(k, str(v)) for k, v in values.items()])


def test_sft_compiles_nothing_after_step_two(assets, tmp_path):
    from wfm_jax.train.sft import SFTTrainer
    with CompileCounter() as counter:
        def on_step(step, metrics):
            counter.counting = step >= 2
        trainer = SFTTrainer(_config("tiny_sft.py", assets, tmp_path), on_step=on_step)
        assert trainer.run() == 4
    assert counter.names == []
    assert trainer.step_fn.compiles() >= 1


@pytest.mark.parametrize("recipe", ["tiny_nft.py", "tiny_grpo.py", "tiny_ddrl.py"])
def test_rl_compiles_nothing_after_step_two(assets, tmp_path, recipe, monkeypatch):
    # steps 1-2 roll out, update, validate, save and export once each; 3-4 repeat all of it
    from wfm_jax.train import rl, rl_setup
    extra = {"train.train_batch_per_replica": 8, "train.train_policy.mini_batch": 1,
             "rollout.n_generation": 2, "policy.diffusers.sample.eval_num_steps": 2,
             "validation.freq": 1, "validation.batch_size": 8}
    if recipe != "tiny_ddrl.py":  # DDRL's train_on steps need its 10 sampling steps
        extra["policy.diffusers.sample.num_steps"] = 3
    run = rl_setup.build(_config(recipe, assets, tmp_path, **extra))
    with CompileCounter() as counter:
        batch_at = run.batcher.batch_at

        def batch_and_count(index):  # the start of step index + 1
            counter.counting = index + 1 >= 3
            return batch_at(index)
        monkeypatch.setattr(run.batcher, "batch_at", batch_and_count)
        try:
            rl._loop(run)
        finally:
            run.close()
    assert counter.names == []
