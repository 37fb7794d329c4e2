"""A grain pipeline over an in-memory list of sample records, with checkpointable state.

Order of operations (per process):
    records -> shuffle(seed), reshuffled every epoch -> repeat forever
            -> load(record, rng(seed, global position))      (lazy: only this shard's items load)
            -> take every shard.count-th item from shard.index  (disjoint across processes)
            -> [worker processes] -> drop + count bad samples -> batch(local batch)
Every process sees the same global order, so sharding is a pure function of (seed, position).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wfm_jax.core.console import say
from wfm_jax.data.errors import BadSample, DataError

try:
    import grain
except ImportError:  # pragma: no cover - grain is a core dependency
    grain = None


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's slice of the data: items index, index + count, index + 2*count, ..."""
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise DataError(f"bad shard index {self.index} of {self.count}")


def process_shard() -> Shard:
    """One shard per JAX process (what grain's ShardByJaxProcess gives)."""
    import jax
    return Shard(jax.process_index(), jax.process_count())


def local_batch_size(global_batch: int, shard: Shard) -> int:
    if global_batch % shard.count:
        raise DataError(f"train_batch_per_replica={global_batch} does not split over "
                        f"{shard.count} processes")
    return global_batch // shard.count


def stack_batch(elements: Sequence[dict]) -> dict:
    """Arrays stack on a new leading axis (dicts of arrays recurse); strings and other dicts
    (prompt metadata) become lists."""
    batch = {}
    for key in elements[0]:
        values = [e[key] for e in elements]
        if isinstance(values[0], dict) and values[0] and all(
                isinstance(v, np.ndarray) for v in values[0].values()):
            batch[key] = stack_batch(values)
        elif isinstance(values[0], np.ndarray):
            shapes = {v.shape for v in values}
            if len(shapes) > 1:
                raise DataError(f"batch key '{key}' has mixed shapes {sorted(shapes)}")
            batch[key] = np.stack(values)
        elif isinstance(values[0], (str, dict, list, tuple)):
            batch[key] = list(values)
        elif isinstance(values[0], (int, float, bool, np.number)):
            batch[key] = np.asarray(values)
        else:
            batch[key] = list(values)
    return batch


@dataclasses.dataclass(frozen=True)
class _Bad:
    message: str


class _LoadWithRng:
    """Picklable map_with_index transform: load(record, rng) with an rng fixed by position."""

    def __init__(self, load: Callable[[Any, np.random.Generator], dict], seed: int, skip_bad: bool):
        self.load, self.seed, self.skip_bad = load, seed, skip_bad

    def __call__(self, position: int, record: Any):
        rng = np.random.default_rng([self.seed, position])
        if not self.skip_bad:
            return self.load(record, rng)
        try:
            return self.load(record, rng)
        except BadSample as e:
            return _Bad(str(e))


def _mark_flags_parsed():
    # grain workers read absl flags; outside absl.app they must be marked parsed
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class Loader:
    """Infinite iterator of batches (dicts) for this process; `state()` / `restore(state)` make a
    resumed run continue with exactly the next batch. Restore needs the same records, seed,
    shard, batch size and num_workers."""

    def __init__(self, records: Sequence[Any], load: Callable[[Any, np.random.Generator], dict],
                 batch_size: int, *, seed: int = 0, shard: Shard = Shard(), shuffle: bool = True,
                 skip_bad: bool = False, num_workers: int = 0, prefetch: int = 2,
                 batch_fn: Callable[[Sequence[dict]], dict] = stack_batch, name: str = "dataset"):
        if not records:
            raise DataError(f"{name} has no samples")
        if batch_size < 1:
            raise DataError(f"batch size must be >= 1, got {batch_size}")
        self.name, self.num_records, self.shard = name, len(records), shard
        self.dataset_size: int | None = len(records)  # items in one pass (None: a stream)
        self.skipped = 0  # bad samples skipped so far (data.skip_bad_samples); repeats count again
        self.bad_files: list[str] = []  # their messages, each once
        self._bad_in_a_row = 0
        ds = grain.MapDataset.source(list(records))
        if shuffle:
            ds = ds.shuffle(seed=seed)
        ds = ds.repeat().map_with_index(_LoadWithRng(load, seed, skip_bad))
        ds = ds[shard.index::shard.count]
        it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=2 if num_workers == 0 else 1,
                                                     prefetch_buffer_size=max(1, prefetch * batch_size)))
        self._start(it_ds, batch_size, batch_fn, num_workers)

    def _start(self, it_ds, batch_size: int, batch_fn, num_workers: int) -> None:
        """Loaded elements (or _Bad) -> [worker processes] -> drop + count bad -> batches."""
        if num_workers > 0:
            _mark_flags_parsed()
            it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
        it_ds = it_ds.filter(self._keep).batch(batch_size, drop_remainder=True, batch_fn=batch_fn)
        self._iterator = iter(it_ds)

    def _keep(self, element) -> bool:
        if not isinstance(element, _Bad):
            self._bad_in_a_row = 0
            return True
        self.skipped += 1
        if element.message not in self.bad_files:
            self.bad_files.append(element.message)
            say(f"skipped a bad sample (data.skip_bad_samples): {element.message}",
                every_process=True)
        self._bad_in_a_row += 1
        if self._bad_in_a_row > self.num_records:
            raise DataError(f"every sample of {self.name} is bad (last: {element.message})")
        return False

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        return next(self._iterator)

    def close(self) -> None:
        """Stop grain's worker processes / prefetch threads (call before exiting)."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def state(self) -> dict:
        """JSON-serialisable position (grain iterator state + the skip log)."""
        return {"grain": self._iterator.get_state(), "skipped": self.skipped,
                "bad_files": list(self.bad_files)}

    def restore(self, state: dict) -> None:
        self._iterator.set_state(state["grain"])
        self.skipped = int(state.get("skipped", 0))
        self.bad_files = list(state.get("bad_files", []))
        self._bad_in_a_row = 0
