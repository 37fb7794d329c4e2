"""The cosine schedule spans the optimizer updates a run applies, not its loop steps.

An RL step runs `mu_iterations` inner epochs, each one optimizer call; with grad_accum_steps > 1
each call is a micro-step of an accumulation window. An SFT step is one update made of
grad_accum_steps micro-steps. Both are driven here through their real update code (the RL loop's
compiled `update` with a stub algorithm, SFT's `train_state_update`) with a constant gradient:
Adam then moves every parameter by exactly the learning rate of that update (up to eps), which
is compared with a numpy warm-up + cosine over the right number of updates.
"""
from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.config.schema import default_config
from wfm_jax.programs.rl import RLLayout, rl_programs
from wfm_jax.programs.setup import SetupError, make_tx, schedule_total_steps, with_stand_in_length
from wfm_jax.programs.state import TrainState, train_state_update

LR, WARMUP, LOOP_STEPS = 1e-2, 2, 4



def _stub_family(vae):
    """The family methods the RL compile step asks of a pipeline: a flow model at shift 3."""
    from wfm_jax.sampling.schedule import default_flow_schedule
    pipe = types.SimpleNamespace(vae=vae, vae_config=None, shift=3.0, default_solver="euler",
                                 flow_schedule=lambda n, solver: default_flow_schedule(n, 3.0,
                                                                                       solver))
    pipe.shell = lambda: pipe
    pipe.guide = lambda v_c, v_u, w: v_u + w * (v_c - v_u)
    return pipe

def np_cosine(count: int, total: int) -> float:
    if count < WARMUP:
        return LR * (count + 1) / WARMUP
    p = min((count - WARMUP) / (total - WARMUP), 1.0)
    return LR * 0.5 * (1 + math.cos(math.pi * p))


def config(kind: str, mu: int = 1, accum: int = 1):
    c = default_config()
    t = c.train
    t.train_policy.type, t.train_policy.mu_iterations, t.grad_accum_steps = kind, mu, accum
    t.max_steps, t.lr_schedule, t.optm_lr, t.optm_warmup_steps = LOOP_STEPS, "cosine", LR, WARMUP
    t.optm_weight_decay, t.optm_grad_norm_clip, t.ema_enable = 0.0, 0.0, False
    return c


def applied_rates(before: list[np.ndarray], after: np.ndarray) -> np.ndarray:
    """The step sizes of the calls that moved the parameters (zero-moves: open windows)."""
    seq = np.stack(before + [after])
    moves = (seq[:-1] - seq[1:]).mean(axis=1)
    return moves[moves != 0]


class ConstantGradient:
    """An RL algorithm whose gradient is 1 for every parameter; it records the parameters each
    optimizer call starts from."""

    keeps_old = False

    def __init__(self):
        self.seen: list[np.ndarray] = []

    def grads(self, velocity, state, ref_params, batch, key):
        jax.debug.callback(lambda w: self.seen.append(np.asarray(w)), state.params["w"],
                           ordered=True)
        return jax.tree.map(jnp.ones_like, state.params), {"loss": jnp.zeros((), jnp.float32)}

    def post_update(self, state, eta):
        return state


@pytest.mark.parametrize("mu,accum", [(2, 1), (3, 2)])
def test_rl_updates_follow_a_cosine_over_all_optimizer_updates(mu, accum):
    cfg = config("grpo", mu, accum)
    total = LOOP_STEPS * mu // accum
    assert schedule_total_steps(cfg) == total
    tx, _ = make_tx(cfg)
    algo = ConstantGradient()
    vae = nnx.Linear(1, 1, rngs=nnx.Rngs(0))  # the update never decodes
    state = TrainState.create({"w": jnp.zeros((4,), jnp.float32)}, tx, jax.random.key(0))
    # the update jit runs under its mesh with fixed shardings: a one-device mesh here
    mesh = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    rep = NamedSharding(mesh, P())
    setup = types.SimpleNamespace(graphdef=None, frozen=None, tx=tx, mesh=mesh, rules=None,
                                  batch_sharding=lambda: NamedSharding(mesh, P("data")),
                                  shardings=jax.tree.map(lambda _: rep, state),
                                  pipe=_stub_family(vae), config=cfg)
    layout = RLLayout(micro_batches=1, rollout_chunk=2, optimize_chunks=1, mu_iterations=mu,
                      row_shards=1)
    update = rl_programs(setup, algo, layout)["update"]
    data = {"x": jnp.zeros((2, 1), jnp.float32)}
    for step in range(LOOP_STEPS):
        state, _ = update(state, None, data, jax.random.key(step), jnp.float32(0.0), {})
    jax.effects_barrier()
    assert len(algo.seen) == LOOP_STEPS * mu  # one optimizer call per inner epoch
    assert int(state.step) == total
    got = applied_rates(algo.seen, np.asarray(state.params["w"]))
    want = [np_cosine(c, total) for c in range(total)]
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_sft_updates_follow_a_cosine_over_loop_steps_with_accumulation():
    cfg = config("sft", accum=2)
    assert schedule_total_steps(cfg) == LOOP_STEPS
    tx, lr_at = make_tx(cfg)
    state = TrainState.create({"w": jnp.zeros((4,), jnp.float32)}, tx, jax.random.key(0))
    step = jax.jit(lambda s: train_state_update(s, {"w": jnp.ones((4,), jnp.float32)}, tx))
    before = []
    for _ in range(LOOP_STEPS * 2):  # the SFT loop: grad_accum_steps micro-steps per step
        before.append(np.asarray(state.params["w"]))
        state, _ = step(state)
    got = applied_rates(before, np.asarray(state.params["w"]))
    want = [np_cosine(c, LOOP_STEPS) for c in range(LOOP_STEPS)]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # the logged rate of loop step s is lr_at(s - 1)
    np.testing.assert_allclose([float(lr_at(c)) for c in range(LOOP_STEPS)], want, rtol=1e-6)


def test_constant_schedule_has_no_total_and_a_warmup_past_the_end_is_one_line():
    cfg = config("grpo", 2)
    cfg.train.lr_schedule = "constant"
    assert schedule_total_steps(cfg) is None
    cfg = config("grpo", 2, accum=2)
    cfg.train.optm_warmup_steps = LOOP_STEPS
    with pytest.raises(SetupError, match=r"optm_warmup_steps=4 .* 4 optimizer updates") as e:
        make_tx(cfg)
    assert "\n" not in str(e.value)


def test_an_unresolved_length_is_refused_and_the_planner_gets_a_stand_in():
    """A trainer resolves train.max_steps from its data before the optimizer
    (config/run_length.py); the weightless setups (planner, bench) have no data and build from a
    stand-in length, which leaves the recipe's config as it was."""
    cfg = config("sft", accum=2)
    cfg.train.max_steps = None
    with pytest.raises(SetupError, match="train.max_steps is not resolved yet"):
        make_tx(cfg)
    planned = with_stand_in_length(cfg)
    assert cfg.train.max_steps is None and schedule_total_steps(planned) > WARMUP
    make_tx(planned)
    cfg.train.max_steps = LOOP_STEPS
    assert with_stand_in_length(cfg) is cfg
