"""Shared fixtures: one real S3 server (SeaweedFS on loopback) per test session, started only
when a test asks for it; and one persistent XLA compilation cache for the whole run.

The cache is shared by the xdist workers and by every subprocess a test starts (through the
JAX_* variables), so a program that several tests build (the tiny SD3 train step, a resumed
run's step) is compiled once per run. A hit loads the executable compiled earlier from the same
HLO and options, so it cannot make a test pass that computes something different. Set
WFM_JAX_TEST_COMPILE_CACHE=off to run without it."""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile

import pytest

from tests import s3_server as _s3

_BUCKETS = itertools.count()
_CACHE_VARIABLE = "WFM_JAX_TEST_COMPILE_CACHE"
# Only compilations slower than this are written: the many tiny jits of unit tests gain nothing.
_CACHE_SETTINGS = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
                   "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def pytest_configure(config):
    if os.environ.get(_CACHE_VARIABLE) == "off":
        return
    if not os.environ.get(_CACHE_VARIABLE):  # the controller (or a run without xdist) makes it
        os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="wfm_jax_xla_cache_")
        config._wfm_jax_cache_owner = True  # its maker removes it at the end
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE_VARIABLE]
    os.environ.update(_CACHE_SETTINGS)
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_VARIABLE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(_CACHE_SETTINGS["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if getattr(config, "_wfm_jax_cache_owner", False):
        shutil.rmtree(os.environ.pop(_CACHE_VARIABLE), ignore_errors=True)


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
