"""Checkpoints and exports mirrored to S3 (train.ckpt.upload_s3 / s3_bucket / s3_prefix), and a
resume that fetches the newest committed checkpoint when output_dir has none.

Layout under s3://<s3_bucket>/<s3_prefix>/ mirrors output_dir:
    checkpoints/<step>/...   + checkpoints/<step>/_COMMIT.json   (written last: the commit)
    safetensors/step_<N>/... + safetensors/step_<N>/_COMMIT.json
    config.json, metrics.jsonl                                     (copies, refreshed per upload)
orbax keeps writing locally (atomic rename); a background thread on process 0 uploads each step
once its directory is final. upload_s3="all": every checkpoint and export; "final": the newest of
each when the run ends. Committed checkpoints beyond train.ckpt.max_keep are deleted under this
prefix (marker first); nothing else on S3 is ever deleted. A step dir queued for upload is never
pruned locally before its upload ends: the checkpoint save and the export prune first wait for
the uploads of the steps they would remove (the loop waits for a slow upload, it loses nothing).
An upload that fails (after boto3's retries) stops the run at its next checkpoint with one line;
its step is never committed.
"""
from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time

import jax

from wfm_jax.core.console import say
from wfm_jax.io.storage import mirror
from wfm_jax.io.storage import s3 as s3lib

_SIDE_FILES = ("config.json", "metrics.jsonl")
# a step's directory name under each kind (the local and the S3 layout alike)
_STEP_DIR = {"checkpoints": str, "safetensors": lambda step: f"step_{step}"}


class S3UploadError(RuntimeError):
    """A checkpoint or export could not be uploaded; the local copies are intact."""


def _location(config) -> tuple[str, str]:
    """(bucket, key root): the prefix with one trailing slash, or "" for the bucket's top."""
    ck = config.train.ckpt
    prefix = ck.s3_prefix.strip("/")
    return ck.s3_bucket, f"{prefix}/" if prefix else ""


def _check_bucket(cfg, bucket: str, prefix: str) -> None:
    try:
        s3lib.client(cfg).head_bucket(Bucket=bucket)
    except Exception as e:
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket"):  # HEAD answers have no body: just the status
            raise s3lib.S3Error(f"train.ckpt.s3_bucket: bucket '{bucket}' does not exist at "
                                f"{cfg.endpoint_url}") from None
        raise s3lib.explain(e, cfg, f"train.ckpt.s3_bucket s3://{bucket}/{prefix}",
                            bucket) from None


def fetch_resume_checkpoint(config) -> int | None:
    """train.resume with an S3 bucket and no local checkpoint: download the newest committed
    step (and config.json / metrics.jsonl) into output_dir; returns the step, or None."""
    bucket, prefix = _location(config)
    if not (config.train.resume and bucket):
        return None
    local = os.path.join(config.train.output_dir, "checkpoints")
    if os.path.isdir(local) and any(n.isdigit() for n in os.listdir(local)):
        return None
    cfg = s3lib.s3_config_from_env()
    _check_bucket(cfg, bucket, prefix)
    try:
        steps = sorted(int(n) for n in mirror.committed(cfg, bucket, f"{prefix}checkpoints")
                       if n.isdigit())
    except Exception as e:
        raise s3lib.explain(e, cfg, f"listing s3://{bucket}/{prefix}checkpoints", bucket) from None
    if not steps:
        return None
    step = steps[-1]
    if jax.process_index() == 0:
        try:
            mirror.download_tree(cfg, bucket, f"{prefix}checkpoints/{step}",
                                 os.path.join(local, str(step)))
            client = s3lib.client(cfg)
            for name in _SIDE_FILES:
                path = os.path.join(config.train.output_dir, name)
                if not os.path.exists(path):
                    # optional copies: the checkpoint is what matters
                    with contextlib.suppress(Exception):
                        client.download_file(bucket, f"{prefix}{name}", path)
        except s3lib.S3Error:
            raise
        except Exception as e:
            raise s3lib.explain(e, cfg, f"downloading s3://{bucket}/{prefix}checkpoints/{step}",
                                bucket) from None
        say(f"downloaded checkpoint step {step} from s3://{bucket}/{prefix}checkpoints/{step}")
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("s3 resume download")
    return step


class S3Sync:
    """The background uploader of one run (process 0 only; other processes get None)."""

    @classmethod
    def from_config(cls, config) -> S3Sync | None:
        if not config.train.ckpt.upload_s3 or jax.process_index() != 0:
            return None
        return cls(config)

    def __init__(self, config):
        ck = config.train.ckpt
        self.mode, self.max_keep = ck.upload_s3, ck.max_keep
        self.bucket, self.prefix = _location(config)
        self.output_dir = config.train.output_dir
        self.cfg = s3lib.s3_config_from_env()
        _check_bucket(self.cfg, self.bucket, self.prefix)
        self._jobs: queue.Queue = queue.Queue()
        self._error: S3UploadError | None = None
        self._stop = threading.Event()
        self._done: set = set()
        self._pending: set = set()  # queued jobs whose upload has not ended
        self._settled = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="s3-upload", daemon=True)
        self._thread.start()

    # -- called by the training loop --
    def checkpoint_saved(self, step: int) -> None:
        self.check()
        if self.mode == "all":
            self._queue(("checkpoints", _STEP_DIR["checkpoints"](step)))

    def exported(self, step: int) -> None:
        self.check()
        if self.mode == "all":
            self._queue(("safetensors", _STEP_DIR["safetensors"](step)))

    def wait_uploaded(self, kind: str, steps) -> None:
        """Block until the queued uploads of `kind` ("checkpoints" or "safetensors") at `steps`
        have ended (uploaded or failed): call before deleting those local dirs. Steps never
        queued return at once."""
        wanted = {(kind, _STEP_DIR[kind](step)) for step in steps}
        with self._settled:
            while wanted & self._pending and self._thread.is_alive():
                self._settled.wait(timeout=1.0)
        self.check()

    def _queue(self, job: tuple[str, str]) -> None:
        with self._settled:
            self._pending.add(job)
        self._jobs.put(job)

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Queue the final uploads ("final"), wait for all of them; raise an upload failure
        unless another exception is already on its way out."""
        if self.mode == "final" and self._error is None:
            for kind, pattern in (("checkpoints", str.isdigit),
                                  ("safetensors", lambda n: n.startswith("step_"))):
                root = os.path.join(self.output_dir, kind)
                names = [n for n in os.listdir(root) if pattern(n)] if os.path.isdir(root) else []
                if names:
                    self._queue((kind, max(names, key=lambda n: int(n.removeprefix("step_")))))
        self._stop.set()  # the checkpointer is closed: a step dir missing now never comes
        self._jobs.put(None)
        self._thread.join()
        if sys.exc_info()[0] is None:
            self.check()

    # -- the worker thread --
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._run(job)
            finally:
                with self._settled:
                    self._pending.discard(job)
                    self._settled.notify_all()

    def _run(self, job: tuple[str, str]) -> None:
        if self._error is not None or job in self._done:
            return
        kind, name = job
        local = os.path.join(self.output_dir, kind, name)
        try:
            self._upload(kind, name)
            self._done.add(job)
        except Exception as e:
            if isinstance(e, FileNotFoundError) and not os.path.isdir(local):
                # never finalized (the run died before the checkpointer renamed it into place)
                say(f"skipped uploading {kind}/{name}: it is gone from {self.output_dir}")
                return
            what = f"uploading {kind}/{name} to s3://{self.bucket}/{self.prefix}{kind}/{name}"
            err = e if isinstance(e, s3lib.S3Error) else s3lib.explain(e, self.cfg, what,
                                                                        self.bucket)
            self._error = S3UploadError(f"{err}; it is not committed on S3, the local copy "
                                        f"in {self.output_dir}/{kind}/{name} is intact")

    def _upload(self, kind: str, name: str) -> None:
        local = os.path.join(self.output_dir, kind, name)
        while not os.path.isdir(local):  # orbax renames the step dir into place when final
            if self._stop.is_set():
                raise FileNotFoundError(local)
            time.sleep(0.05)
        base = f"{self.prefix}{kind}/{name}"
        mirror.upload_tree(self.cfg, local, self.bucket, base, extra={"name": name})
        client = s3lib.client(self.cfg)
        for side in _SIDE_FILES:
            path = os.path.join(self.output_dir, side)
            if os.path.exists(path):
                client.upload_file(path, self.bucket, f"{self.prefix}{side}")
        say(f"uploaded {kind}/{name} to s3://{self.bucket}/{base}")
        if kind == "checkpoints" and self.max_keep:
            steps = sorted(int(n) for n in mirror.committed(self.cfg, self.bucket,
                                                            f"{self.prefix}checkpoints")
                           if n.isdigit())
            for old in steps[:-self.max_keep]:
                mirror.delete_tree(self.cfg, self.bucket, f"{self.prefix}checkpoints/{old}")
                say(f"removed checkpoint step {old} from s3://{self.bucket}/{self.prefix}"
                    f"checkpoints (train.ckpt.max_keep={self.max_keep})")
