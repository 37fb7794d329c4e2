"""Nothing compiles again after the first steps: every train jit has explicit shardings, so the
state an update returns is laid out exactly as it went in. Four steps of the tiny SFT recipe on
an 8-device FSDP mesh, a checkpoint and an export at steps 2 and 4: once step 2 has run every
kind of work once, steps 3 and 4 must compile nothing (XLA backend compilations counted through
jax.monitoring, and hits of a persistent compilation cache, as tests/_resume.py turns on: a
program fetched from such a cache was still built again). The RL recipes' checks ride on their
20-step reward-rise runs, also on an 8-device FSDP mesh: each of
tests/train/test_rl_{nft,grpo,ddrl}.py has test_nothing_compiles_once_every_kind_of_work_ran."""
from __future__ import annotations

import os

import pytest

from tests._support.compiles import CompileCounter
from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import load_config

pytestmark = [pytest.mark.slow, pytest.mark.compile_bound]

CONFIGS = CONFIGS


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("assets")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes"), count=16, size=16, seed=0))


def _config(assets, out_dir):
    pipe, shapes = assets
    values = {"policy.model_name_or_path": pipe, "train.output_dir": str(out_dir),
              "policy.parallelism.data": 1, "policy.parallelism.fsdp": 8,
              "policy.diffusers.inference_size": "(16, 16)", "train.max_steps": 4,
              "train.ckpt.save_freq": 2, "train.ckpt.export_safetensors": True,
              "train.train_policy.dataset.local_dir": shapes}
    return load_config(os.path.join(CONFIGS, "tiny_sft.py"), [(k, str(v)) for k, v in values.items()])


def test_sft_compiles_nothing_after_step_two(assets, tmp_path):
    from wfm_jax.train.sft import SFTTrainer
    with CompileCounter() as counter:
        def on_step(step, metrics):
            counter.counting = step >= 2
        trainer = SFTTrainer(_config(assets, tmp_path), on_step=on_step)
        assert trainer.run() == 4
    assert counter.names == []
    assert trainer.step_fn.compiles() >= 1
