"""$WFM_JAX_BENCH_WEIGHTS: the benchmark's converted random weights kept across processes (a GPU
lease's parts), read back equal to a fresh draw; a torn entry is drawn again."""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.bench import weights
from wfm_jax.bench.suites import TINY_TRANSFORMER
from wfm_jax.core.tree import flat_arrays


def _build():
    return flat_arrays(weights.jax_module("transformer", TINY_TRANSFORMER, dtype=jnp.float32,
                                          param_dtype=jnp.float32))


def test_second_build_reads_the_cache_and_equals_a_fresh_draw(tmp_path, monkeypatch):
    monkeypatch.delenv(weights.WEIGHTS_CACHE_ENV, raising=False)
    fresh = _build()
    monkeypatch.setenv(weights.WEIGHTS_CACHE_ENV, str(tmp_path))
    first = _build()  # draws, converts and writes the cache
    (entry,) = os.listdir(tmp_path)
    assert entry.startswith("SD3Transformer2DModel-")

    def no_draw(*args, **kwargs):
        raise AssertionError("drew the weights again instead of reading the cache")
    monkeypatch.setattr(weights, "random_state_dict", no_draw)
    second = _build()
    assert sorted(second) == sorted(fresh) == sorted(first)
    for path in fresh:
        np.testing.assert_array_equal(second[path], fresh[path])
        np.testing.assert_array_equal(first[path], fresh[path])

    os.remove(tmp_path / entry / "index.json")  # torn: as if its writer was killed mid-way
    with pytest.raises(AssertionError, match="drew the weights again"):
        _build()
    monkeypatch.undo()
    monkeypatch.setenv(weights.WEIGHTS_CACHE_ENV, str(tmp_path))
    rewritten = _build()  # drawn again and written over the torn entry
    assert os.listdir(tmp_path) == [entry] and os.path.isfile(tmp_path / entry / "index.json")
    for path in fresh:
        np.testing.assert_array_equal(rewritten[path], fresh[path])


def test_another_seed_is_another_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(weights.WEIGHTS_CACHE_ENV, str(tmp_path))
    for seed in (0, 1):
        weights.jax_module("transformer", TINY_TRANSFORMER, dtype=jnp.float32,
                           param_dtype=jnp.float32, seed=seed)
    assert len(os.listdir(tmp_path)) == 2
