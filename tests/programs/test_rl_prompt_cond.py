"""RL keeps each step's prompt conditioning once per device (programs/rl_encode.py), not once per
rollout row: the update's rows take theirs from that table by index.

The RL loop's real compiled `update` (programs.rl.rl_programs) runs with a stub algorithm that
records, per micro-batch, its rows and the conditioning they were given, and whose gradient is
the rows' mean conditioning: with the table it must see, row for row, the conditioning the
per-row layout gives it, and move the parameters to the same bits, unchunked (micro-batches of
rows j, j + n, ...) and chunked (a fresh per-device row order each epoch). The table is built by
the trainer's own code (device_slots), on a batch of groups of repeats as GroupBatcher makes it.
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.programs.rl import RLLayout, cond_slots, rl_programs
from wfm_jax.programs.rl_encode import device_slots, max_local_groups
from wfm_jax.programs.state import TrainState

BATCH, N_GEN, SHARDS, DIM, TOKENS = 16, 4, 2, 3, 2


class CondRows:
    """Gradient: the mean over the micro-batch of each row's conditioning summed over tokens;
    records (rows, conditioning) per call."""
    keeps_old = False

    def __init__(self):
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def grads(self, velocity, state, ref_params, batch, key):
        e = batch["cond"]["e"].astype(jnp.float32)
        grads, metrics = jax.grad(lambda p: (
            jnp.mean(e.sum(1) @ p["w"]), {"loss": jnp.mean(e.sum(1) @ p["w"])}),
            has_aux=True)(state.params)
        jax.debug.callback(lambda r, c: self.calls.append((np.asarray(r).astype(int),
                                                           np.asarray(c))), batch["row"], e)
        return grads, metrics

    def post_update(self, state, eta):
        return state


def _mesh():
    return Mesh(np.asarray(jax.devices()[:8]).reshape(SHARDS, 4), ("data", "context"))


def _update(algo, layout, state, tx):
    mesh = _mesh()
    rep = NamedSharding(mesh, P())
    pipe = types.SimpleNamespace(vae=None, guide=None)
    pipe.shell = lambda: pipe
    cfg = types.SimpleNamespace(train=types.SimpleNamespace(ema_decay=0.9,
                                                            ema_update_step_interval=1))
    setup = types.SimpleNamespace(graphdef=None, frozen=None, tx=tx, mesh=mesh, rules=None,
                                  batch_sharding=lambda: NamedSharding(mesh, P("data")),
                                  shardings=jax.tree.map(lambda _: rep, state), pipe=pipe,
                                  config=cfg)
    return rl_programs(setup, algo, layout)["update"]


def _batch():
    """Prompts as GroupBatcher lays them out (N_GEN repeats each, in order); each prompt's
    conditioning (TOKENS, DIM); the per-row layout and the table layout of the same rows."""
    rng = np.random.default_rng(0)
    prompts = [f"p{i // N_GEN}" for i in range(BATCH)]
    by_prompt = {p: rng.normal(size=(TOKENS, DIM)).astype(np.float32) for p in set(prompts)}
    rows = NamedSharding(_mesh(), P("data"))
    per_row = np.stack([by_prompt[p] for p in prompts])
    slots = cond_slots(BATCH, N_GEN, SHARDS)
    table_prompts, index = device_slots(prompts, np.arange(BATCH), BATCH, SHARDS, slots)
    table = np.stack([by_prompt[p] for p in table_prompts])
    common = {"row": jax.device_put(np.arange(BATCH, dtype=np.float32), rows)}
    row_data = dict(common, cond={"e": jax.device_put(per_row, rows)})
    table_data = dict(common, cond={}, prompt_cond={"e": jax.device_put(table, rows)},
                      cond_index=jax.device_put(index, rows))
    return per_row, slots, row_data, table_data


@pytest.mark.parametrize("chunks,micro", [(1, 2), (2, 4)])
def test_rows_get_their_own_prompts_conditioning_and_the_same_update(chunks, micro):
    per_row, slots, row_data, table_data = _batch()
    assert slots == 2 and table_data["prompt_cond"]["e"].shape[0] == SHARDS * slots  # 4 of 16 rows
    tx = optax.sgd(0.1)
    results = {}
    for name, data, n_slots in (("row", row_data, 0), ("table", table_data, slots)):
        layout = RLLayout(micro_batches=micro, rollout_chunk=BATCH // micro,
                          optimize_chunks=chunks, mu_iterations=2, row_shards=SHARDS,
                          cond_slots=n_slots)
        algo = CondRows()
        state = TrainState.create({"w": jnp.zeros((DIM,), jnp.float32)}, tx, jax.random.key(0))
        update = _update(algo, layout, state, tx)
        state, metrics = update(state, None, data, jax.random.key(3), jnp.float32(0.0), {})
        jax.effects_barrier()
        results[name] = (np.asarray(state.params["w"]), jax.device_get(metrics), algo.calls)
    w_row, m_row, calls_row = results["row"]
    w_table, m_table, calls_table = results["table"]
    assert np.array_equal(w_row, w_table)  # the same update, bit for bit
    assert m_row == m_table
    assert calls_table and len(calls_table) == len(calls_row)
    for rows, cond in calls_table:  # every row its own prompt's conditioning
        assert len(rows) == BATCH // micro
        np.testing.assert_array_equal(cond, per_row[rows])


def test_device_slots_index_each_devices_own_prompts():
    # 12 rows, 3 repeats of 4 prompts, over 4 devices of 3 rows: one prompt per device; over 2
    # devices of 6 rows: 2 each; groups of 4 over 2 devices of 6 rows straddle: 2 slots
    prompts = [f"p{i // 3}" for i in range(12)]
    table, index = device_slots(prompts, np.arange(12), 12, 4, 1)
    assert table == ["p0", "p1", "p2", "p3"] and not index.any()
    table, index = device_slots(prompts, np.arange(12), 12, 2, 2)
    assert table == ["p0", "p1", "p2", "p3"] and list(index) == [0, 0, 0, 1, 1, 1] * 2
    prompts = [f"p{i // 4}" for i in range(12)]
    assert cond_slots(12, 4, 2) == 2 == max_local_groups(12, 4, 2)
    assert cond_slots(12, 4, 3) == 1
    table, index = device_slots(prompts, np.arange(12), 12, 2, 2)
    assert table == ["p0", "p1", "p1", "p2"]
    assert list(index) == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]
    table, index = device_slots(prompts[:8], np.arange(8), 8, 2, 2)
    assert table == ["p0", "p0", "p1", "p1"]  # one prompt a device, padded with the last
    # a process holding rows 6..11 only: its devices' slots, its rows' indices
    table, index = device_slots(prompts[6:], np.arange(6, 12), 12, 2, 2)
    assert table == ["p1", "p2"] and list(index) == [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"3 distinct prompts, more than the 2"):
        device_slots([f"p{i}" for i in range(6)], np.arange(6), 6, 2, 2)


def test_cond_slots_is_the_layouts_bound():
    assert cond_slots(576, 12, 4) == 12     # Cosmos-2B NFT on 4 chips: 144 rows, 12 prompts
    assert cond_slots(576, 12, 64) == 2     # 9 rows a device straddle two groups
    assert cond_slots(8, 3, 2) == 4         # groups that do not divide the batch: every row
    assert cond_slots(1152, 24, 8) == 6
