"""Shared fixtures: one real S3 server (SeaweedFS on loopback) per test session, started only
when a test asks for it; one persistent XLA compilation cache per test run."""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile

import pytest

from tests import s3_server as _s3

_BUCKETS = itertools.count()
_CACHE_ENV = "WFM_JAX_TEST_COMPILE_CACHE"  # a directory to keep, or "0" for no cache


def pytest_configure(config):
    """Many files build the same tiny pipelines and resume runs compile their first run's
    programs again: one persistent compilation cache, shared by the xdist workers (the
    controller makes it before they start, they inherit the variable), turns those repeats into
    cache reads. The CLI subprocesses that tests start read the same JAX_* variables."""
    path = os.environ.get(_CACHE_ENV)
    if path == "0":
        return
    if not path:
        path = tempfile.mkdtemp(prefix="wfm_jax_xla_cache_")
        os.environ[_CACHE_ENV] = path
        config._wfm_jax_cache_made = path  # removed when the run ends
    import jax
    for name, value in (("jax_compilation_cache_dir", path),
                        ("jax_persistent_cache_min_compile_time_secs", 0.0),
                        ("jax_persistent_cache_min_entry_size_bytes", 0)):
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)


def pytest_unconfigure(config):
    made = getattr(config, "_wfm_jax_cache_made", None)
    if made and not hasattr(config, "workerinput"):
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # never probe a cloud metadata IP
    server = _s3.start(str(tmp_path_factory.mktemp("weed")))
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the session server, with cosmos-rl's credential variables set for it
    (and the AWS_* ones cleared, so nothing else leaks in)."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "PROD_S3_CHECKPOINT_")) and name != "AWS_EC2_METADATA_DISABLED":
            monkeypatch.delenv(name)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = f"wfm-t{os.getpid()}-{next(_BUCKETS)}"
    s3_server.client().create_bucket(Bucket=bucket)
    return bucket
