"""Shared fixtures: one real S3 server (SeaweedFS on loopback) per test session, started only
when a test asks for it."""
from __future__ import annotations

import gc
import itertools
import os

import pytest

from tests import s3_server as _s3
from tests._support.xla import compile_cpu_at_o0, install_compile_level_switch, use_test_flags

_BUCKETS = itertools.count()

use_test_flags()  # LLVM -O1, the older CPU emitters: see tests/_support/xla.py
# every plan the tests make compiles what it reports (and writes nothing under ~/.cache): the
# plan cache's own tests give it a directory (tests/plan/test_stats_cache.py)
os.environ.setdefault("WFM_JAX_PLAN_CACHE", "off")

# The longest files first (worker seconds on 2 idle cores, session 21's suite: 90-250 s each).
# `--dist loadfile` hands whole files to the two workers in queue order, so a long file queued
# late runs on alone at the end while the other worker has nothing left to take.
LONGEST_FIRST = (
    "tests/train/test_vlm_sft_learns.py", "tests/train/test_cosmos_train.py",
    "tests/plan/test_layers.py", "tests/families/test_family_sharded.py",
    "tests/plan/test_plan_vlm.py", "tests/train/test_sana_train.py", "tests/train/test_rl_ddrl.py",
    "tests/train/test_rl_nft.py", "tests/families/wan/test_wan_e2e.py",
    "tests/train/test_rl_grpo.py", "tests/models/layers/test_scan_layers.py",
    "tests/train/test_sft_train.py", "tests/models/layers/test_context_parallel.py",
    "tests/programs/test_vlm_grpo.py", "tests/bench/test_bench.py",
    "tests/models/layers/test_remat_memory.py", "tests/plan/test_plan_recipes.py",
    "tests/plan/test_estimate.py",
)


def pytest_configure(config):
    """Keep the queue in collection order: xdist otherwise re-sorts the files by their number of
    tests (`--loadscope-reorder`, its default), which put the one-test 4-minute learning run last
    (session 21: it started 33 minutes into a 38-minute suite)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    install_compile_level_switch()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A `compile_bound` test (and the fixtures it sets up first) compiles its CPU programs at
    LLVM -O0; every other test at the session's -O1 (tests/_support/xla.py)."""
    compile_cpu_at_o0(item.get_closest_marker("compile_bound") is not None)


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, tuned for a process that traces thousands of programs:
    the modules imported so far (jax, torch, transformers: about 0.5M objects) move out of its
    reach (gc.freeze), and a full collection waits for 1M allocations instead of 70k. On the SD3
    transformer and scan-layer files its time fell from 6.5 to 1.4 s of about 100 s
    (docs/development.md, session 27); garbage cycles are still collected, only less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's files first, in its order; every other file after them in collection
    order (a stable sort: the tests of each file keep theirs)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


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
