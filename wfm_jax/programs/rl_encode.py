"""The text conditioning of an RL batch, each distinct prompt encoded once.

NFT and GRPO batches repeat every prompt n_generation times; encoding per rollout chunk ran the
text encoders once per repeat. Here the batch's distinct prompts are encoded in the encoder's
own chunk size (the same compiled program as before, padded with the last prompt) and every
chunk's rows are gathered from them on the device. The encoders treat rows independently, so a
row's conditioning is the same bits whichever rows share its call (tests/train/test_loop_overlap.py).

What the update keeps of it is one table per step, not a copy per row: each device's part holds
the distinct prompts of its own rows (`slots` of them, RLLayout.cond_slots), in the dtype the
family's transformer casts it to first (PipelineFamily.cond_storage_dtypes), and each row an
index into its device's part (programs/rl.py gathers a micro-batch's rows from it). Cosmos'
Reason1 embedding is 100,352 wide: per row in float32 it was 30 GB a device of the 2B NFT batch.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.core.mesh import mesh_jit
from wfm_jax.programs.setup import batch_shards


def max_local_groups(global_batch: int, n_generation: int, processes: int) -> int:
    """The most prompt groups any process's contiguous slice of the batch touches: every
    process makes the same number of encoder calls (they are collective)."""
    local = global_batch // processes
    return max((p * local + local - 1) // n_generation - (p * local) // n_generation + 1
               for p in range(processes))


def process_rows(sharding, n: int) -> np.ndarray:
    """Global rows of this process's rows in an (n, ...) array built from process-local data
    (jax.make_array_from_process_local_data: the process's shards, in global order)."""
    rows = set()
    for index in sharding.addressable_devices_indices_map((n,)).values():
        rows.update(range(*index[0].indices(n)))
    return np.asarray(sorted(rows), np.int32)


@functools.lru_cache(maxsize=8)
def _gather_fn(sharding, dtypes: tuple = ()):
    """The encoder calls' rows at `index`, each key in `dtypes` ((key, dtype name) pairs) cast."""
    cast = dict(dtypes)

    def gather(calls, index):
        every = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *calls)
        return {k: jnp.take(a, index, axis=0).astype(cast.get(k, a.dtype)) for k, a in every.items()}
    return mesh_jit(gather, mesh=sharding.mesh, out_shardings=sharding)


def chunk_conditions(run, prompts: list[str], chunk: int) -> list[dict]:
    """The conditioning of each rollout chunk (rows lo:lo + chunk of this process's `prompts`),
    as run.encode(prompts[lo:lo + chunk]) gives it, from one encoding of each distinct prompt."""
    return rollout_conditions(run, prompts, chunk)[0]


def rollout_conditions(run, prompts: list[str], chunk: int, slots: int = 0,
                       dtypes: dict | None = None) -> tuple[list[dict], dict]:
    """(chunk_conditions' list, what the update keeps): with slots > 0 the latter is
    {"prompt_cond": the table (shards x slots rows, split over the batch axes, each key in
    `dtypes` cast), "cond_index": (rows,) int32, each row's slot in its device's part}; with 0, {}.
    The rows of device d are d * local .. (d + 1) * local - 1 of the global batch (local = rows /
    shards), this process's `prompts` the contiguous slice of them it holds."""
    unique = list(dict.fromkeys(prompts))
    calls = -(-_unique_bound(run, len(prompts), len(unique)) // chunk)
    padded = unique + [unique[-1]] * (calls * chunk - len(unique))
    encoded = [run.encode(padded[k * chunk:(k + 1) * chunk]) for k in range(calls)]
    sharding = run.setup.batch_sharding()
    mine = process_rows(sharding, chunk * jax.process_count())
    width = len(mine) * jax.process_count()  # global rows of one encoder call
    slot = {p: (u // chunk) * width + mine[u % chunk] for u, p in enumerate(unique)}
    gather = _gather_fn(sharding)
    out = []
    for lo in range(0, len(prompts), chunk):
        index = np.asarray([slot[p] for p in prompts[lo:lo + chunk]], np.int32)
        out.append(gather(encoded, run.setup.global_batch(index)))
    if not slots:
        return out, {}
    rows_of = process_rows(sharding, len(prompts) * jax.process_count())
    table_rows, cond_index = device_slots(prompts, rows_of, len(prompts) * jax.process_count(),
                                          batch_shards(run.setup), slots)
    table_index = np.asarray([slot[p] for p in table_rows], np.int32)
    key = tuple(sorted((k, jnp.dtype(v).name) for k, v in (dtypes or {}).items()))
    table = _gather_fn(sharding, key)(encoded, run.setup.global_batch(table_index))
    return out, {"prompt_cond": table, "cond_index": run.setup.global_batch(cond_index)}


def device_slots(prompts: list[str], rows: np.ndarray, total: int, shards: int,
                 slots: int) -> tuple[list[str], np.ndarray]:
    """(the prompt of each table row this process holds: `slots` per device it holds rows of,
    its distinct prompts in order, padded with the last; each of its rows' slot there).
    rows: the global row of each of `prompts` (process_rows); total: the global batch."""
    local = total // shards
    table, index = [], np.zeros(len(prompts), np.int32)
    for d in sorted({int(r) // local for r in rows}):
        mine = [i for i, r in enumerate(rows) if int(r) // local == d]
        distinct = list(dict.fromkeys(prompts[i] for i in mine))
        if len(distinct) > slots:
            raise ValueError(f"device {d}'s {len(mine)} rows hold {len(distinct)} distinct "
                             f"prompts, more than the {slots} the layout keeps for them (rows must "
                             f"come in groups of rollout.n_generation repeats of one prompt)")
        for i in mine:
            index[i] = distinct.index(prompts[i])
        table += distinct + [distinct[-1]] * (slots - len(distinct))
    return table, index


def _unique_bound(run, rows: int, unique: int) -> int:
    """Distinct prompts to encode per process: the layout's bound, the same on every process
    (a batcher without group layout: every row)."""
    b = run.batcher
    if jax.process_count() == 1:
        return unique
    if not all(hasattr(b, a) for a in ("global_batch", "n_generation")):
        return rows
    return max(unique, max_local_groups(b.global_batch, b.n_generation, jax.process_count()))
