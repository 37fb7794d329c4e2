"""Group sampler: n_generation copies of each prompt, layout over processes/devices, errors, state."""
import numpy as np
import pytest

from wfm_jax.config.schema import default_config
from wfm_jax.data import DataError, GroupBatcher, PromptRecord, Shard, eval_batches
from wfm_jax.data.groups import group_batcher_from_config

RECORDS = [PromptRecord(f"p{i}", {"id": i}) for i in range(10)]


def global_batch(batchers, step):
    parts = [b.batch_at(step) for b in batchers]
    return ([p for part in parts for p in part["prompt"]],
            np.concatenate([part["group"] for part in parts]))


def test_groups_repeat_each_prompt_and_stay_together():
    batchers = [GroupBatcher(RECORDS, 12, 3, seed=0, shard=Shard(i, 2)) for i in range(2)]
    assert batchers[0].local_batch == 6 and batchers[0].groups == 4 and not batchers[0].straddles
    prompts, groups = global_batch(batchers, 0)
    assert len(prompts) == 12
    # rows come in runs of n_generation copies of one prompt, one group id per run
    for g in range(4):
        run = prompts[3 * g:3 * g + 3]
        assert len(set(run)) == 1
        np.testing.assert_array_equal(groups[3 * g:3 * g + 3], g)
    assert len(set(prompts)) == 4  # distinct prompts within a batch
    # a group never crosses the process boundary (6 rows each = 2 whole groups)
    assert not set(batchers[0].batch_at(0)["prompt"]) & set(batchers[1].batch_at(0)["prompt"])
    # metadata and records travel with the prompt
    part = batchers[1].batch_at(0)
    assert all(m["id"] == int(p[1:]) for p, m in zip(part["prompt"], part["metadata"]))
    assert [r.prompt for r in part["records"]] == part["prompt"]


def test_epoch_covers_prompts_without_repeats_then_reshuffles():
    batcher = GroupBatcher(RECORDS, 6, 3, seed=5)  # 2 prompts a batch, 5 batches an epoch
    epoch1 = [p for s in range(5) for p in batcher.batch_at(s)["prompt"][::3]]
    epoch2 = [p for s in range(5, 10) for p in batcher.batch_at(s)["prompt"][::3]]
    assert sorted(epoch1) == sorted(r.prompt for r in RECORDS)
    assert sorted(epoch2) == sorted(epoch1) and epoch2 != epoch1
    assert GroupBatcher(RECORDS, 6, 3, seed=5).batch_at(3)["prompt"] == batcher.batch_at(3)["prompt"]
    other = GroupBatcher(RECORDS, 6, 3, seed=6)
    assert [p for s in range(5) for p in other.batch_at(s)["prompt"][::3]] != epoch1


def test_straddle_flag():
    # 12 rows over 2 devices = 6 each, groups of 4: a group must cross a device boundary
    assert GroupBatcher(RECORDS, 12, 4, data_parallel=2).straddles
    # groups of 4 over 4 devices of 2 rows: each device holds half of one group only
    assert not GroupBatcher(RECORDS, 8, 4, data_parallel=4).straddles


def test_errors_name_the_numbers():
    with pytest.raises(DataError, match="train_batch_per_replica=10 is not a multiple of "
                                        "rollout.n_generation=4"):
        GroupBatcher(RECORDS, 10, 4)
    with pytest.raises(DataError, match="train_batch_per_replica=12 does not divide over "
                                        "8 data-parallel devices"):
        GroupBatcher(RECORDS, 12, 3, data_parallel=8)
    with pytest.raises(DataError, match="has 10 prompts, fewer than the 12 distinct prompts"):
        GroupBatcher(RECORDS, 24, 2)


def test_state_round_trip():
    batcher = GroupBatcher(RECORDS, 6, 2, seed=1, shard=Shard(1, 2))
    for _ in range(7):
        next(batcher)
    state = batcher.state()
    want = [next(batcher) for _ in range(3)]
    resumed = GroupBatcher(RECORDS, 6, 2, seed=1, shard=Shard(1, 2))
    resumed.restore(state)
    for w in want:
        got = next(resumed)
        assert got["prompt"] == w["prompt"] and got["step"] == w["step"]
        np.testing.assert_array_equal(got["group"], w["group"])


def test_eval_batches_pad_and_flag():
    shards = [list(eval_batches(RECORDS[:7], 4, Shard(i, 2))) for i in range(2)]
    assert len(shards[0]) == len(shards[1]) == 2
    seen = [p for b in range(2) for s in range(2) for p, v in
            zip(shards[s][b]["prompt"], shards[s][b]["valid"]) if v]
    assert seen == [f"p{i}" for i in range(7)]
    assert shards[1][1]["prompt"] == ["p6", "p6"] and list(shards[1][1]["valid"]) == [True, False]


def test_from_config():
    config = default_config()
    config.train.train_batch_per_replica = 8
    config.rollout.n_generation = 4
    batcher = group_batcher_from_config(config, RECORDS, shard=Shard(0, 1), data_parallel=8)
    assert batcher.groups == 2 and batcher.local_batch == 8
