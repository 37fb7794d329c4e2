"""Acceptance: tiny SFT reading WebDataset shards (s3:// on the real test server, and local
*.tar), uploading every checkpoint and export to S3; the local output dir deleted; the resumed
run (train.resume=True) continues from the newest committed S3 checkpoint and its loss curve is
bit-identical to the uninterrupted run's."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests import _shards
from tests._resume import persistent_compile_cache
from tests._support.paths import REPO_ROOT
from wfm_jax.config.recipe import load_config
from wfm_jax.io.storage import mirror
from wfm_jax.io.storage import s3 as s3lib
from wfm_jax.train import sft

pytestmark = pytest.mark.slow

ROOT = REPO_ROOT
KEYS = ("train/loss", "optimizer/grad_norm", "train/learning_rate")


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("s3_sft")
    shapes = build_shapes_dataset(str(root / "shapes"), count=16, size=32, seed=0)
    _shards.shards_from_paired_dir(shapes, str(root / "tars"), per_shard=4)
    return build_tiny_pipeline(str(root / "pipe"), seed=0), str(root / "tars"), root / "cache"


def _config(assets, out, data, bucket, prefix, **extra):
    values = {"policy.model_name_or_path": assets[0], "train.train_policy.dataset.local_dir": data,
              "train.output_dir": str(out), "policy.diffusers.inference_size": "(16, 16)",
              "train.train_batch_per_replica": "8", "train.ckpt.save_freq": "2",
              "train.ckpt.max_keep": "2", "train.max_steps": "6", "data.cycle_length": "2",
              "train.ckpt.upload_s3": "all", "train.ckpt.s3_bucket": bucket,
              "train.ckpt.s3_prefix": prefix, **extra}
    return load_config(f"{ROOT}/configs/tiny_sft.py",
                       [(k.replace("__", "."), str(v)) for k, v in values.items()])


def _metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def _kill_at(n):
    def hook(step, metrics):
        if step == n:
            raise _Killed()
    return hook


def _committed(bucket, prefix, kind):
    return sorted(mirror.committed(s3lib.s3_config_from_env(), bucket, f"{prefix}/{kind}"))


@pytest.mark.parametrize("source", ["s3", "local"])
def test_resume_from_s3_after_losing_the_output_dir(assets, s3_server, s3_bucket, tmp_path,
                                                    source):
    data = assets[1]
    if source == "s3":
        _shards.upload_dir(s3_server.client(), assets[1], s3_bucket, "shards")
        data = f"s3://{s3_bucket}/shards"
    with persistent_compile_cache(assets[2]):
        full = tmp_path / "full"
        assert sft.run(_config(assets, full, data, s3_bucket, "full")) == 6
        # every checkpoint and export was uploaded; max_keep=2 pruned the old steps on S3 only
        assert _committed(s3_bucket, "full", "checkpoints") == ["4", "6"]
        assert _committed(s3_bucket, "full", "safetensors") == ["step_2", "step_4", "step_6"]

        run = tmp_path / "run"
        with pytest.raises(_Killed):
            sft.run(_config(assets, run, data, s3_bucket, "run"), on_step=_kill_at(5))
        assert _committed(s3_bucket, "run", "checkpoints") == ["2", "4"]
        shutil.rmtree(run)  # the machine is gone: only S3 is left
        assert sft.run(_config(assets, run, data, s3_bucket, "run", train__resume=True)) == 6
    got, want = _metrics(run), _metrics(full)
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 7):
        for key in KEYS:
            assert got[step][key] == want[step][key], (step, key)
    assert _committed(s3_bucket, "run", "checkpoints") == ["4", "6"]
