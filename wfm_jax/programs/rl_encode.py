"""The text conditioning of an RL batch, each distinct prompt encoded once.

NFT and GRPO batches repeat every prompt n_generation times; encoding per rollout chunk ran the
text encoders once per repeat. Here the batch's distinct prompts are encoded in the encoder's
own chunk size (the same compiled program as before, padded with the last prompt) and every
chunk's rows are gathered from them on the device. The encoders treat rows independently, so a
row's conditioning is the same bits whichever rows share its call (tests/train/test_loop_overlap.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.core.mesh import mesh_jit


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
def _gather_fn(sharding):
    def gather(calls, index):
        every = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *calls)
        return jax.tree.map(lambda a: jnp.take(a, index, axis=0), every)
    return mesh_jit(gather, mesh=sharding.mesh, out_shardings=sharding)


def chunk_conditions(run, prompts: list[str], chunk: int) -> list[dict]:
    """The conditioning of each rollout chunk (rows lo:lo + chunk of this process's `prompts`),
    as run.encode(prompts[lo:lo + chunk]) gives it, from one encoding of each distinct prompt."""
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
    return out


def _unique_bound(run, rows: int, unique: int) -> int:
    """Distinct prompts to encode per process: the layout's bound, the same on every process
    (a batcher without group layout: every row)."""
    b = run.batcher
    if jax.process_count() == 1:
        return unique
    if not all(hasattr(b, a) for a in ("global_batch", "n_generation")):
        return rows
    return max(unique, max_local_groups(b.global_batch, b.n_generation, jax.process_count()))
