"""DDRL's data loss reading WebDataset shards from s3:// (the real test server): the same run,
metric for metric, as on the paired directory the shards were packed from."""
from __future__ import annotations

import os

import pytest

from tests import _rl_toy as toy
from tests import _shards
from tests._resume import persistent_compile_cache
from tests._support.paths import REPO_ROOT
from wfm_jax.cli import main as wmain

pytestmark = [pytest.mark.slow, pytest.mark.compile_bound]

RECIPE = os.path.join(REPO_ROOT, "configs",
                      "tiny_ddrl.py")


def test_ddrl_on_s3_shards_equals_the_paired_dir(tmp_path, s3_server, s3_bucket):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    pipe = build_tiny_pipeline(str(tmp_path / "pipe"), seed=0)
    shapes = build_shapes_dataset(str(tmp_path / "shapes"))
    _shards.shards_from_paired_dir(shapes, str(tmp_path / "tars"), per_shard=5)
    _shards.upload_dir(s3_server.client(), str(tmp_path / "tars"), s3_bucket, "ddrl")
    runs = {}
    with persistent_compile_cache(tmp_path / "jax_cache"):  # the second run compiles nothing
        for name, data in (("dir", shapes), ("s3", f"s3://{s3_bucket}/ddrl")):
            out = tmp_path / name
            assert wmain.main([  # small and short: 16x16, 4 EDM steps, 2 trained
                "--config", RECIPE, f"--config.policy.model_name_or_path={pipe}",
                f"--config.train.train_policy.dataset.local_dir={data}",
                f"--config.train.output_dir={out}", "--config.train.max_steps=1",
                "--config.train.train_policy.mini_batch=1", "--config.train.train_batch_per_replica=8",
                "--config.policy.diffusers.inference_size=(16, 16)",
                "--config.policy.diffusers.sample.num_steps=4",
                "--config.train.train_policy.train_on=(0, 2)",
                "--config.validation.enable=False",
                "--config.train.ckpt.export_safetensors=False"]) == 0
            runs[name] = toy.metrics(out)
    for step in (1,):
        for key in ("train/loss", "train/data_loss", "train/reward_mean"):
            assert runs["s3"][step][key] == runs["dir"][step][key], (step, key)
        assert runs["s3"][step]["train/data_loss"] > 0
