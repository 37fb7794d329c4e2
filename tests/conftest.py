"""Shared fixtures: one real S3 server (SeaweedFS on loopback) per test session, started only
when a test asks for it."""
from __future__ import annotations

import itertools
import os

import pytest

from tests import s3_server as _s3
from tests._support.xla import use_test_flags

_BUCKETS = itertools.count()

use_test_flags()  # LLVM -O1: see tests/_support/xla.py


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
