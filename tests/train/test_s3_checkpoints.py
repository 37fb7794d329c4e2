"""The S3 checkpoint mirror against the real server: a half upload (no commit marker) is never
resumed from; the server killed during an upload fails the run with one line and leaves no
committed step; a bucket that does not exist and missing credentials are one line each."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import time

import pytest

from tests import s3_server as s3srv
from tests._support.paths import REPO_ROOT
from wfm_jax.config.recipe import load_config
from wfm_jax.io.storage import mirror
from wfm_jax.io.storage import s3 as s3lib
from wfm_jax.train import s3_sync

ROOT = REPO_ROOT


def _config(out, bucket, **extra):
    values = {"train.output_dir": str(out), "train.ckpt.upload_s3": "all",
              "train.ckpt.s3_bucket": bucket, "train.ckpt.s3_prefix": "runs/a",
              "train.ckpt.max_keep": "5", **extra}
    return load_config(f"{ROOT}/configs/tiny_sft.py",
                       [(k.replace("__", "."), str(v)) for k, v in values.items()])


def _fake_step(out, step, files=3, size=1000):
    d = out / "checkpoints" / str(step)
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"part_{i}").write_bytes(os.urandom(size))
    (out / "metrics.jsonl").write_text(f'{{"step": {step}}}\n')
    return d


def test_half_upload_is_never_resumed(s3_bucket, tmp_path):
    cfg = s3lib.s3_config_from_env()
    out = tmp_path / "out"
    mirror.upload_tree(cfg, str(_fake_step(out, 2)), s3_bucket, "runs/a/checkpoints/2")
    step4 = _fake_step(out, 4)
    client = s3lib.client(cfg)  # a run that died before the marker: files, no _COMMIT.json
    client.upload_file(str(step4 / "part_0"), s3_bucket, "runs/a/checkpoints/4/part_0")
    assert mirror.committed(cfg, s3_bucket, "runs/a/checkpoints") == ["2"]
    fresh = tmp_path / "fresh"
    assert s3_sync.fetch_resume_checkpoint(_config(fresh, s3_bucket, train__resume=True)) == 2
    assert sorted(os.listdir(fresh / "checkpoints")) == ["2"]
    assert (fresh / "checkpoints" / "2" / "part_1").read_bytes() == \
        (out / "checkpoints" / "2" / "part_1").read_bytes()
    # deleting un-commits first and removes every object of the step
    assert mirror.delete_tree(cfg, s3_bucket, "runs/a/checkpoints/2") == 3
    assert mirror.committed(cfg, s3_bucket, "runs/a/checkpoints") == []


def test_missing_bucket_is_one_line(s3_bucket, tmp_path):
    with pytest.raises(s3lib.S3Error, match="bucket 'no-such-bucket-y' does not exist"):
        s3_sync.S3Sync(_config(tmp_path, "no-such-bucket-y"))
    with pytest.raises(s3lib.S3Error, match="bucket 'no-such-bucket-y' does not exist"):
        s3_sync.fetch_resume_checkpoint(_config(tmp_path, "no-such-bucket-y", train__resume=True))


def test_cli_without_credentials_names_the_variables(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "PROD_S3_CHECKPOINT_"))}
    env["PYTHONPATH"] = ROOT
    (tmp_path / "pipe").mkdir()  # the model dir is checked first; the data next
    out = subprocess.run(
        [sys.executable, "-m", "wfm_jax.main", "--config", f"{ROOT}/configs/tiny_sft.py",
         f"--config.train.output_dir={tmp_path}/out",
         "--config.train.train_policy.dataset.local_dir=s3://some-bucket/shards",
         "--config.train.train_policy.dataset.build_tiny=False",
         f"--config.policy.model_name_or_path={tmp_path}/pipe"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and "PROD_S3_CHECKPOINT_ENDPOINT_URL" in lines[0] \
        and "AWS_ACCESS_KEY_ID" in lines[0], out.stderr


@pytest.mark.slow
def test_server_killed_during_upload(tmp_path, monkeypatch):
    """A server of its own (this one dies): the upload fails loudly, nothing is committed for
    the interrupted step, and after a restart resume takes the last committed one."""
    server = s3srv.start(str(tmp_path / "weed"), bucket="killed-run")
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        out = tmp_path / "out"
        sync = s3_sync.S3Sync(_config(out, "killed-run"))
        _fake_step(out, 2)
        sync.checkpoint_saved(2)
        client = server.client()
        deadline = time.monotonic() + 60
        while "2" not in mirror.committed(sync.cfg, "killed-run", "runs/a/checkpoints"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        _fake_step(out, 4, files=40, size=256 << 10)
        sync.checkpoint_saved(4)
        while not client.list_objects_v2(Bucket="killed-run",
                                         Prefix="runs/a/checkpoints/4/").get("KeyCount"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.kill()
        with pytest.raises(s3_sync.S3UploadError) as e:
            sync.finish()
        msg = str(e.value)
        assert "checkpoints/4" in msg and "not committed" in msg and "\n" not in msg
        assert "cannot reach the S3 endpoint" in msg, msg
        assert (out / "checkpoints" / "4").is_dir()  # the local copy is kept
    finally:
        server.stop()
    server = s3srv.start(str(tmp_path / "weed"), bucket="killed-run")  # same data dir
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        cfg = s3lib.s3_config_from_env()
        assert server.client().list_objects_v2(Bucket="killed-run",
                                                Prefix="runs/a/checkpoints/4/")["KeyCount"] > 0
        assert mirror.committed(cfg, "killed-run", "runs/a/checkpoints") == ["2"]
        fresh = tmp_path / "fresh"
        assert s3_sync.fetch_resume_checkpoint(_config(fresh, "killed-run",
                                                       train__resume=True)) == 2
    finally:
        server.stop()


def test_final_mode_uploads_the_newest_at_the_end(s3_bucket, tmp_path):
    """upload_s3="final": nothing while the run goes, the newest checkpoint and export when it
    ends; an empty s3_prefix puts them at the top of the bucket."""
    out = tmp_path / "out"
    sync = s3_sync.S3Sync(_config(out, s3_bucket, train__ckpt__upload_s3="final",
                                  train__ckpt__s3_prefix=""))
    cfg = sync.cfg
    for step in (2, 10):
        _fake_step(out, step)
        sync.checkpoint_saved(step)
        export = out / "safetensors" / f"step_{step}"
        export.mkdir(parents=True)
        (export / "model.safetensors").write_bytes(b"w" * step)
        sync.exported(step)
    assert mirror.committed(cfg, s3_bucket, "checkpoints") == []
    sync.finish()
    assert mirror.committed(cfg, s3_bucket, "checkpoints") == ["10"]
    assert mirror.committed(cfg, s3_bucket, "safetensors") == ["step_10"]
    body = s3lib.client(cfg).get_object(Bucket=s3_bucket, Key="metrics.jsonl")["Body"].read()
    assert body == b'{"step": 10}\n'


def test_a_slow_upload_holds_the_local_prune(s3_bucket, tmp_path, monkeypatch):
    """The uploader behind the loop (a busy host): export_max_keep's prune of step_2 waits for
    step_2's upload instead of deleting it first, so every export still reaches S3 (CI once
    lost step_2 this way)."""
    from wfm_jax.train.export import prune_exports
    out = tmp_path / "out"
    real = mirror.upload_tree

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(mirror, "upload_tree", slow)
    sync = s3_sync.S3Sync(_config(out, s3_bucket))
    for step in (2, 4, 6):
        export = out / "safetensors" / f"step_{step}"
        export.mkdir(parents=True)
        (export / "model.safetensors").write_bytes(b"w" * step)
        sync.exported(step)
        prune_exports(str(out), 2, before_delete=functools.partial(sync.wait_uploaded,
                                                                    "safetensors"))
    assert sorted(os.listdir(out / "safetensors")) == ["step_4", "step_6"]
    sync.finish()
    assert mirror.committed(sync.cfg, s3_bucket, "runs/a/safetensors") == [
        "step_2", "step_4", "step_6"]


@pytest.mark.parametrize("async_", [False, True])
def test_a_slow_upload_holds_max_keep(s3_bucket, tmp_path, monkeypatch, async_):
    """The same for checkpoints: TrainSetup.save waits for the uploads of the steps orbax's
    max_keep would delete (an async save's step counted once it is final), so with
    upload_s3="all" every step is committed once."""
    import types

    import jax.numpy as jnp

    from wfm_jax.train.checkpoint import Checkpointer
    from wfm_jax.train.setup import TrainSetup
    out = tmp_path / "out"
    real, uploaded = mirror.upload_tree, []

    def slow(cfg, local, bucket, base, **kwargs):
        time.sleep(0.5)
        uploaded.append(base.rsplit("/", 1)[-1])
        return real(cfg, local, bucket, base, **kwargs)

    monkeypatch.setattr(mirror, "upload_tree", slow)
    run = types.SimpleNamespace(
        checkpointer=Checkpointer(out / "checkpoints", max_keep=1, save_freq=1, async_=async_),
        state={"w": jnp.arange(3.0)}, s3=s3_sync.S3Sync(_config(out, s3_bucket,
                                                                train__ckpt__max_keep="1")))
    for step in (1, 2, 3):
        assert TrainSetup.save(run, step)
    TrainSetup.close(run)
    assert uploaded == ["1", "2", "3"]
    assert sorted(os.listdir(out / "checkpoints")) == ["3"]
    assert mirror.committed(s3lib.s3_config_from_env(), s3_bucket, "runs/a/checkpoints") == ["3"]
