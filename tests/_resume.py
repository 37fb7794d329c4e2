"""Kill-and-resume checks for the RL end-to-end tests (DiffusionNFT, Flow-GRPO, DDRL).

A run is killed the way a user kills it (KeyboardInterrupt out of the metrics logger after a
step that has no checkpoint), resumed with train.resume=True, and compared with an
uninterrupted run of the same recipe: every leaf of the saved train state (params, optimizer
moments and count, EMA, aux, step, PRNG key), every logged metric except timings, and the
batches each process read.

`persistent_compile_cache` keeps both runs from compiling the same programs again: a cache hit
loads the executable an earlier run compiled from the same HLO, so it cannot hide a resume that
changes the computation (that would be a different HLO, compiled afresh).
"""
from __future__ import annotations

import contextlib
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental.compilation_cache import compilation_cache

from wfm_jax.cli import main as wmain
from wfm_jax.data.groups import GroupBatcher
from wfm_jax.train.metrics import MetricsLogger

TIMING = ("time/", "train/samples_per_s", "train/iteration_time")


def _cache_settings(directory) -> dict:
    """jax config name -> value: every compilation goes through the on-disk cache in `directory`."""
    return {"jax_compilation_cache_dir": str(directory), "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_persistent_cache_min_entry_size_bytes": 0}


def compile_cache_env(directory) -> dict[str, str]:
    """The same settings as environment variables, for the processes a test starts."""
    return {name.upper(): str(value) for name, value in _cache_settings(directory).items()}


@contextlib.contextmanager
def persistent_compile_cache(directory):
    """Every compilation inside goes through an on-disk cache in `directory`; the previous
    settings come back after."""
    settings = _cache_settings(directory)
    old = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        for name, value in old.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def metric_rows(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def saved_state(out_dir, step: int) -> dict:
    """{leaf path: numpy array} of the train state checkpointed at `step`."""
    tree = ocp.PyTreeCheckpointer().restore(
        os.path.join(out_dir, "checkpoints", str(step), "state"))
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def saved_data_state(out_dir, step: int) -> dict:
    with open(os.path.join(out_dir, "checkpoints", str(step), "data",
                           "process_0-of-1.json")) as f:
        return json.load(f)


def kill_and_resume(monkeypatch, argv, kill_after: int, resume_to: int) -> dict:
    """Run `argv` (its save_freq must leave step kill_after without a checkpoint), kill it after
    step `kill_after` is logged, resume it to `resume_to`. Returns the batch indices
    (GroupBatcher.batch_at arguments) each of the two processes read."""
    real_log, real_batch_at = MetricsLogger.log, GroupBatcher.batch_at
    read: list[int] = []

    def log_then_die(self, step, metrics):
        record = real_log(self, step, metrics)
        if step == kill_after:
            raise KeyboardInterrupt
        return record

    def recording_batch_at(self, k):
        read.append(int(k))
        return real_batch_at(self, k)

    monkeypatch.setattr(GroupBatcher, "batch_at", recording_batch_at)
    monkeypatch.setattr(MetricsLogger, "log", log_then_die)
    assert wmain.main(argv) == wmain.EXIT_INTERRUPTED
    killed = list(read)
    read.clear()
    monkeypatch.setattr(MetricsLogger, "log", real_log)
    assert wmain.main(argv + ["--config.train.resume=True",
                              f"--config.train.max_steps={resume_to}"]) == 0
    return {"killed": killed, "resumed": list(read)}


def assert_resumed_run_matches(resumed_dir, reference_dir, last_step: int) -> None:
    """Metrics of steps 1..last_step (timings aside) and the step-`last_step` train state equal
    the reference run's bit for bit."""
    rows = metric_rows(resumed_dir)
    assert [r["step"] for r in rows] == list(range(1, last_step + 1))  # the killed step: once
    reference = {r["step"]: r for r in metric_rows(reference_dir)}
    for row in rows:
        want = {k: v for k, v in reference[row["step"]].items() if not k.startswith(TIMING)}
        got = {k: v for k, v in row.items() if not k.startswith(TIMING)}
        assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want)
                             if got.get(k) != want.get(k)}
    got, want = saved_state(resumed_dir, last_step), saved_state(reference_dir, last_step)
    assert sorted(got) == sorted(want)
    assert any(k.startswith("['opt_state']") for k in got)
    assert any(k.startswith("['ema']") for k in got)
    differ = [k for k in got if not np.array_equal(got[k], want[k])]
    assert not differ, differ[:5]
    assert saved_data_state(resumed_dir, last_step) == {"step": last_step}
