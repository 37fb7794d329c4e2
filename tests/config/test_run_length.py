"""The run length from train.epoch, train.max_steps and the training set's size, by cosmos-rl's
rule (config/run_length.py), against hand-computed counts."""
from __future__ import annotations

import json

import pytest

from wfm_jax.config.base import ConfigError
from wfm_jax.config.run_length import resolve_max_steps, run_steps, steps_by_dataset
from wfm_jax.config.schema import default_config


@pytest.mark.parametrize("samples, batch, epoch, accum, want", [
    (10, 4, 1, 1, 2),    # floor(10 / 4): the short last batch is dropped
    (10, 4, 3, 1, 6),    # per epoch, then times the epochs (not floor(30 / 4) = 7)
    (8, 4, 2, 1, 4),
    (20, 4, 1, 2, 2),    # a step takes grad_accum_steps batches: floor(20 / 8)
    (3, 4, 5, 1, 0),     # fewer samples than a batch: no step
])
def test_sft_counts_whole_batches_per_epoch(samples, batch, epoch, accum, want):
    assert steps_by_dataset(samples, sft=True, batch=batch, epoch=epoch,
                            grad_accum_steps=accum) == want


@pytest.mark.parametrize("prompts, batch, n, epoch, want", [
    (6, 16, 4, 2, 3),    # 6 x 4 x 2 rows in batches of 16 (per-epoch floors would give 2)
    (8, 16, 4, 1, 2),
    (10, 1152, 24, 100000, 10 * 24 * 100000 // 1152),  # cosmos-rl's SD3.5 NFT recipe's rule
    (3, 16, 4, 1, 0),
])
def test_rl_counts_every_rollout_row_of_every_pass(prompts, batch, n, epoch, want):
    assert steps_by_dataset(prompts, sft=False, batch=batch, epoch=epoch, n_generation=n) == want


def test_epoch_zero_is_refused():
    with pytest.raises(ConfigError, match=r"'train.epoch' must be > 0, got 0"):
        steps_by_dataset(10, sft=True, batch=2, epoch=0)


def _config(max_steps=None, epoch=None, kind="sft", batch=4, n=4):
    c = default_config()
    c.train.max_steps, c.train.epoch, c.train.train_policy.type = max_steps, epoch, kind
    c.train.train_batch_per_replica, c.rollout.n_generation = batch, n
    return c


@pytest.mark.parametrize("max_steps, epoch, samples, want", [
    (None, None, 10, 2),     # neither: one pass (cosmos-rl's default epoch)
    (None, 2, 10, 4),        # epoch only
    (7, None, 10, 7),        # max_steps only: exactly that (the data repeats)
    (7, None, 3, 7),         # ... even on a set smaller than a batch (wfm_jax's tiny recipes)
    (7, None, None, 7),      # ... or a stream of unknown length
    (3, 2, 10, 3),           # both: the smaller (cosmos-rl)
    (100, 2, 10, 4),
    (5, 2, None, 5),         # a stream: the epoch cannot bound it, max_steps does
])
def test_run_steps(max_steps, epoch, samples, want):
    assert run_steps(_config(max_steps, epoch), samples) == want


def test_rl_run_steps_use_the_groups():
    assert run_steps(_config(epoch=2, kind="nft", batch=16, n=4), 6) == 3


def test_no_length_is_one_line():
    with pytest.raises(ConfigError, match=r"make no full step of 4 \(train_batch_per_replica x "
                                          r"grad_accum_steps\): the run would have 0 steps"):
        run_steps(_config(epoch=3), 3)
    with pytest.raises(ConfigError, match=r"make no full step of 4 \(train_batch_per_replica / "
                                          r"rollout.n_generation\)"):
        run_steps(_config(kind="grpo", batch=16, n=4), 3)
    with pytest.raises(ConfigError, match=r"set --config.train.max_steps=N"):
        run_steps(_config(epoch=1), None)


def test_resolve_writes_the_length_and_says_it(tmp_path, capsys):
    c = _config(epoch=2)
    c.train.output_dir = str(tmp_path)
    assert resolve_max_steps(c, 10, "images") == 4
    assert c.train.max_steps == 4 and c.train.epoch == 2
    assert "run length: 4 steps (2 epoch(s) over 10 images)" in capsys.readouterr().out
    # a resume whose data changed says the run's length moved
    (tmp_path / "config.json").write_text(json.dumps({"train": {"max_steps": 4}}))
    c = _config(epoch=2)
    c.train.output_dir, c.train.resume = str(tmp_path), True
    assert resolve_max_steps(c, 14, "images") == 6
    assert "note: the run started with 4 steps" in capsys.readouterr().out
    c = _config(max_steps=9)  # a plain step count: said nowhere, changed nothing
    assert resolve_max_steps(c, 3) == 9 and capsys.readouterr().out == ""
