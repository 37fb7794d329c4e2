"""Group sampling for RL: each global batch holds `global_batch // n_generation` distinct prompts,
each repeated `n_generation` times (cosmos-rl / flow_grpo `DistributedKRepeatSampler`).

Layout of one global batch (rows): [p0 x G, p1 x G, ...], so with the batch axis split into
contiguous equal chunks over data-parallel devices (and processes), a group lies inside one
device whenever (batch / devices) is a multiple of G, and a device holds one group's rows only
whenever G is a multiple of (batch / devices): no other layout straddles less. Prompts are drawn
by a grain index shuffle that is redrawn each epoch; batches never repeat a prompt (the epoch's
remainder is dropped). Batch k is a pure function of (seed, k), so the state is just k.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from wfm_jax.data.errors import DataError
from wfm_jax.data.loader import Shard, process_shard


def check_group_layout(global_batch: int, n_generation: int, data_parallel: int) -> None:
    if n_generation < 1 or global_batch < 1:
        raise DataError(f"train_batch_per_replica={global_batch} and rollout.n_generation="
                        f"{n_generation} must be >= 1")
    if global_batch % n_generation:
        raise DataError(f"train_batch_per_replica={global_batch} is not a multiple of "
                        f"rollout.n_generation={n_generation}")
    if global_batch % data_parallel:
        raise DataError(f"train_batch_per_replica={global_batch} does not divide over "
                        f"{data_parallel} data-parallel devices")


def _rows(records: Sequence[Any], indices: np.ndarray) -> dict:
    picked = [records[i] for i in indices]
    return {"prompt": [getattr(r, "prompt", r) for r in picked],
            "metadata": [getattr(r, "metadata", {}) for r in picked],
            "records": picked,
            "index": np.asarray(indices, np.int64)}


class GroupBatcher:
    """Infinite iterator of this process's rows of each global batch:
    {"prompt": list[str], "metadata": list[dict], "records": list, "index": dataset index (int64),
     "group": the prompt's group number within the global batch (int32, 0..groups-1),
     "step": k}. `data_parallel` is the number of devices the batch axis is split over
    (default: the number of processes)."""

    def __init__(self, records: Sequence[Any], global_batch: int, n_generation: int, *,
                 seed: int = 0, shard: Shard = Shard(), data_parallel: int | None = None,
                 shuffle: bool = True):
        data_parallel = data_parallel or shard.count
        check_group_layout(global_batch, n_generation, data_parallel)
        if global_batch % shard.count:
            raise DataError(f"train_batch_per_replica={global_batch} does not split over "
                            f"{shard.count} processes")
        self.groups = global_batch // n_generation
        if len(records) < self.groups:
            raise DataError(f"the prompt dataset has {len(records)} prompts, fewer than the "
                            f"{self.groups} distinct prompts each batch needs "
                            f"(train_batch_per_replica={global_batch} / n_generation={n_generation})")
        self.records, self.n_generation, self.shard = list(records), n_generation, shard
        self.global_batch, self.local_batch = global_batch, global_batch // shard.count
        per_device = global_batch // data_parallel
        self.straddles = per_device % n_generation != 0 and n_generation % per_device != 0
        ds = grain.MapDataset.range(len(self.records))
        if shuffle:
            ds = ds.shuffle(seed=seed)
        self._batches = ds.batch(self.groups, drop_remainder=True, batch_fn=np.asarray).repeat()
        self.step = 0

    def batch_at(self, step: int) -> dict:
        prompts = np.asarray(self._batches[step], np.int64)
        rows = np.repeat(prompts, self.n_generation)
        group = np.repeat(np.arange(self.groups, dtype=np.int32), self.n_generation)
        lo = self.shard.index * self.local_batch
        mine = slice(lo, lo + self.local_batch)
        out = _rows(self.records, rows[mine])
        out.update(group=group[mine], step=step)
        return out

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def state(self) -> dict:
        return {"step": self.step}

    def restore(self, state: dict) -> None:
        self.step = int(state["step"])


def eval_batches(records: Sequence[Any], global_batch: int, shard: Shard = Shard()) -> Iterator[dict]:
    """Every record once, in order, in global batches; the last is padded by repeating the final
    record and flagged with "valid" (bool) so padded rows can be ignored."""
    if global_batch % shard.count:
        raise DataError(f"validation.batch_size={global_batch} does not split over "
                        f"{shard.count} processes")
    local = global_batch // shard.count
    n = len(records)
    for start in range(0, n, global_batch):
        positions = np.arange(start, start + global_batch)
        indices = np.minimum(positions, n - 1)
        mine = slice(shard.index * local, (shard.index + 1) * local)
        out = _rows(records, indices[mine])
        out["valid"] = positions[mine] < n
        yield out


def group_batcher_from_config(config, records: Sequence[Any], shard: Shard | None = None,
                              data_parallel: int | None = None) -> GroupBatcher:
    """Keys: train.train_batch_per_replica (global), rollout.n_generation, train.seed, data.shuffle."""
    return GroupBatcher(records, config.train.train_batch_per_replica, config.rollout.n_generation,
                        seed=config.train.seed, shard=shard or process_shard(),
                        data_parallel=data_parallel, shuffle=config.data.shuffle)
