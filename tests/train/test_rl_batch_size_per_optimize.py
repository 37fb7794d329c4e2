"""train.train_policy.batch_size_per_optimize: each inner epoch goes over the batch in a fresh
random row order, cut into chunks of that many rows, one optimizer update per chunk.

The RL loop's real compiled `update` (programs.rl.rl_programs) runs with a stub algorithm whose
gradient is the mean of the rows' vectors x_i, on a batch split over 2 devices of the 8-device
CPU mesh, with an optimizer that moves the parameters by exactly -lr(count) x gradient. An
independent numpy replay checks the number of updates, each one's rate (a warm-up + cosine over
max_steps x mu_iterations x chunks updates) and gradient (the mean over exactly its chunk's rows),
that every row is used once per epoch and that micro-batches stay split over both devices.
"""
from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.config.recipe import ConfigError, validate
from wfm_jax.config.schema import default_config
from wfm_jax.programs.rl import RLLayout, chunk_layout, rl_layout, rl_programs
from wfm_jax.programs.setup import SetupError, make_tx, schedule_total_steps
from wfm_jax.programs.state import TrainState

LR, WARMUP = 1e-2, 2
LOOP_STEPS, MU, BATCH, PER_OPTIMIZE, SHARDS, DIM = 2, 2, 8, 4, 2, 5
CHUNKS, MICRO = BATCH // PER_OPTIMIZE, BATCH // SHARDS  # mini_batch 1: micro-batch = 2 rows



def _stub_family(vae):
    """The family methods the RL compile step asks of a pipeline: a flow model at shift 3."""
    from wfm_jax.sampling.schedule import default_flow_schedule
    pipe = types.SimpleNamespace(vae=vae, vae_config=None, shift=3.0, default_solver="euler",
                                 flow_schedule=lambda n, solver: default_flow_schedule(n, 3.0,
                                                                                       solver))
    pipe.shell = lambda: pipe
    pipe.guide = lambda v_c, v_u, w: v_u + w * (v_c - v_u)
    return pipe

def config(per_optimize=PER_OPTIMIZE, batch=BATCH, mini_batch=1):
    c = default_config()
    t = c.train
    t.train_policy.type, t.train_policy.mu_iterations = "grpo", MU
    t.train_batch_per_replica, t.train_policy.mini_batch = batch, mini_batch
    t.train_policy.batch_size_per_optimize = per_optimize
    c.rollout.n_generation = 2
    c.policy.diffusers.sample.solver = "sde"
    t.max_steps, t.lr_schedule, t.optm_lr, t.optm_warmup_steps = LOOP_STEPS, "cosine", LR, WARMUP
    t.ema_enable = False
    return c


def np_cosine(count: int, total: int) -> float:
    if count < WARMUP:
        return LR * (count + 1) / WARMUP
    p = min((count - WARMUP) / (total - WARMUP), 1.0)
    return LR * 0.5 * (1 + math.cos(math.pi * p))


class MeanOfRows:
    """Loss mean_i w . x_i over a micro-batch; records each call's rows, starting parameters
    and (keeps_old) the old values it was given. Old value of row r: 10 r."""

    def __init__(self, keeps_old: bool):
        self.keeps_old = keeps_old
        self.calls: list[dict] = []

    def _record(self, kind, rows, w, old):
        self.calls.append({"kind": kind, "rows": np.asarray(rows).astype(int),
                           "w": np.asarray(w), "old": None if old is None else np.asarray(old)})

    def grads(self, velocity, state, ref_params, batch, key, old=None, first=True):
        grads, metrics = jax.grad(lambda p: (
            jnp.mean(batch["x"] @ p["w"]), {"loss": jnp.mean(batch["x"] @ p["w"])}),
            has_aux=True)(state.params)
        kind = "first" if first else "later"
        jax.debug.callback(lambda r, w, o=None: self._record(kind, r, w, o), batch["row"],
                           state.params["w"], *(() if first or old is None else (old,)),
                           )
        if not self.keeps_old:
            return grads, metrics
        return grads, metrics, (batch["row"] * 10.0 if first else old)

    def post_update(self, state, eta):
        return state


def compiled_update(algo, cfg, tx, state):
    vae = nnx.Linear(1, 1, rngs=nnx.Rngs(0))  # the update never decodes
    mesh = _mesh()
    rep = NamedSharding(mesh, P())
    setup = types.SimpleNamespace(graphdef=None, frozen=None, tx=tx, mesh=mesh, rules=None,
                                  batch_sharding=lambda: NamedSharding(mesh, P("data")),
                                  shardings=jax.tree.map(lambda _: rep, state),
                                  pipe=_stub_family(vae), config=cfg)
    layout = RLLayout(micro_batches=MICRO, rollout_chunk=BATCH // MICRO, optimize_chunks=CHUNKS,
                      mu_iterations=MU, row_shards=SHARDS)
    return rl_programs(setup, algo, layout)["update"]


def _mesh():
    return Mesh(np.asarray(jax.devices()[:8]).reshape(SHARDS, 4), ("data", "context"))


@pytest.fixture(scope="module")
def batch():
    rows = NamedSharding(_mesh(), P("data"))
    x = np.random.default_rng(0).normal(size=(BATCH, DIM)).astype(np.float32)
    data = {"x": jax.device_put(x, rows),
            "row": jax.device_put(np.arange(BATCH, dtype=np.float32), rows)}
    return x, data


@pytest.mark.parametrize("keeps_old", [False, True])
def test_one_update_per_chunk_of_a_fresh_permutation_each_epoch(batch, keeps_old):
    x, data = batch
    cfg = config()
    total = LOOP_STEPS * MU * CHUNKS
    assert schedule_total_steps(cfg) == total
    _, lr_at = make_tx(cfg)
    tx = optax.scale_by_schedule(lambda count: -lr_at(count))  # params -= lr(count) x grad
    algo = MeanOfRows(keeps_old)
    state = TrainState.create({"w": jnp.zeros((DIM,), jnp.float32)}, tx, jax.random.key(0))
    update = compiled_update(algo, cfg, tx, state)
    metrics = []
    for step in range(LOOP_STEPS):
        state, m = update(state, None, data, jax.random.key(10 + step), jnp.float32(0.0), {})
        metrics.append(jax.device_get(m))
    jax.effects_barrier()
    assert int(state.step) == total

    # callbacks on several devices come unordered: a call is placed by the parameters it saw
    calls = [c for c in algo.calls if c["kind"] == "later" or not keeps_old]
    olds = [c for c in algo.calls if c["kind"] == "first"] if keeps_old else []
    per_update = PER_OPTIMIZE // (BATCH // MICRO)  # micro-batches per chunk
    assert len(calls) == LOOP_STEPS * MU * CHUNKS * per_update
    # keeps_old: the old values of every row come from the policy before the step's first
    # update (one pass over the batch), and each later call gets its own rows' values
    assert len(olds) == (LOOP_STEPS * MICRO if keeps_old else 0)
    for c in calls:
        assert (not keeps_old) or np.array_equal(c["old"], 10.0 * c["rows"])

    def seen_at(pool, w):
        return [c for c in pool if np.allclose(c["w"], w, rtol=1e-5, atol=1e-7)]

    w = np.zeros(DIM, np.float64)
    norms, chunks = [], []
    for u in range(total):
        if keeps_old and u % (MU * CHUNKS) == 0:  # the step's old-value pass, before updating
            assert sorted(np.concatenate([c["rows"] for c in seen_at(olds, w)])) == list(
                range(BATCH))
        mine = seen_at(calls, w)
        assert len(mine) == per_update
        for c in mine:  # one row from each device's block: the micro-batch stays split
            assert sorted(r // (BATCH // SHARDS) for r in c["rows"]) == list(range(SHARDS))
        rows = np.concatenate([c["rows"] for c in mine])
        chunks.append(frozenset(rows.tolist()))
        g = x[rows].astype(np.float64).mean(0)  # the chunk mean
        norms.append(np.linalg.norm(g))
        w = w - np_cosine(u, total) * g
    np.testing.assert_allclose(np.asarray(state.params["w"]), w, rtol=1e-5, atol=1e-7)

    epochs = [chunks[e * CHUNKS:(e + 1) * CHUNKS] for e in range(LOOP_STEPS * MU)]
    for epoch in epochs:  # every row once per epoch, PER_OPTIMIZE rows per update
        assert sorted(r for chunk in epoch for r in chunk) == list(range(BATCH))
        assert all(len(chunk) == PER_OPTIMIZE for chunk in epoch)
    # a fresh order each epoch: the two epochs of a loop step cut the batch differently
    assert any(epochs[s * MU] != epochs[s * MU + 1] for s in range(LOOP_STEPS))
    # grad_norm: the mean over the step's updates
    for step, m in enumerate(metrics):
        np.testing.assert_allclose(m["grad_norm"],
                                   np.mean(norms[step * MU * CHUNKS:(step + 1) * MU * CHUNKS]),
                                   rtol=1e-5)

    # the same state and key give the same update bit for bit (a resumed run)
    again = TrainState.create({"w": jnp.zeros((DIM,), jnp.float32)}, tx, jax.random.key(0))
    for step in range(LOOP_STEPS):
        again, _ = update(again, None, data, jax.random.key(10 + step), jnp.float32(0.0), {})
    assert np.array_equal(np.asarray(again.params["w"]), np.asarray(state.params["w"]))


def test_chunk_layout_with_one_chunk_and_no_shuffle_is_the_unchunked_layout():
    x = jnp.arange(24 * 3).reshape(24, 3)
    n_micro, shards = 3, 4
    unchunked = jnp.swapaxes(x.reshape(24 // n_micro, n_micro, 3), 0, 1)
    order = jnp.tile(jnp.arange(24 // shards), (shards, 1))
    got = chunk_layout(x, order, 1, n_micro, shards)
    assert np.array_equal(np.asarray(got[0]), np.asarray(unchunked))


@pytest.mark.parametrize("value,message", [
    (0, r"'train.train_policy.batch_size_per_optimize' must be > 0"),
    (6, r"train_batch_per_replica=8 is not a multiple of "
        r"train.train_policy.batch_size_per_optimize=6"),
])
def test_bad_batch_size_per_optimize_is_one_config_line(value, message):
    with pytest.raises(ConfigError, match=message) as e:
        validate(config(per_optimize=value))
    assert "\n" not in str(e.value)


def test_batch_size_per_optimize_below_a_micro_batch_is_one_setup_line():
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(8, 1, 1), ("data", "fsdp", "context"))
    setup = types.SimpleNamespace(mesh=mesh, rules=None)
    cfg = config(per_optimize=8, batch=32, mini_batch=2)  # micro-batch: 2 x 8 devices
    with pytest.raises(SetupError, match=r"batch_size_per_optimize=8 must divide "
                       r"train_batch_per_replica=32 and be a multiple of "
                       r"train_policy.mini_batch=2 x 8 data-parallel devices") as e:
        rl_layout(cfg, setup)
    assert "\n" not in str(e.value)
    cfg = config(per_optimize=16, batch=32, mini_batch=2)
    layout = rl_layout(cfg, setup)
    assert (layout.micro_batches, layout.optimize_chunks) == (2, 2)  # 2 micro-batches, 2 updates


def test_schedule_total_counts_chunks_and_accumulation():
    cfg = config()
    cfg.train.grad_accum_steps = 2
    assert schedule_total_steps(cfg) == LOOP_STEPS * MU * CHUNKS // 2
    cfg.train.train_policy.batch_size_per_optimize = None  # the whole batch: one per epoch
    assert schedule_total_steps(cfg) == LOOP_STEPS * MU // 2
