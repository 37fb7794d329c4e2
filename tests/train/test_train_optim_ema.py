"""Optimizer, schedule, accumulation, EMA and train-state update against numpy references."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wfm_jax.programs.ema import ema_init, ema_update, soft_update
from wfm_jax.programs.optim import apply_gradients, make_lr_schedule, make_optimizer
from wfm_jax.programs.state import TrainState, train_state_update

# ---------- numpy references (written from the rules, not from the code) ----------

def np_lr(count, lr, warmup, schedule, total=None, min_ratio=0.0):
    if count < warmup:
        return lr * (count + 1) / warmup
    if schedule == "constant":
        return lr
    p = min((count - warmup) / (total - warmup), 1.0)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def np_adamw(params, grads_seq, lrs, b1, b2, eps, wd, clip):
    """torch.optim.AdamW after torch.nn.utils.clip_grad_norm_, float64."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, (g, lr) in enumerate(zip(grads_seq, lrs), start=1):
        g = {k: x.astype(np.float64) for k, x in g.items()}
        if clip:
            norm = math.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
            scale = min(1.0, clip / norm) if norm > 0 else 1.0
            g = {k: x * scale for k, x in g.items()}
        for k in p:
            p[k] = p[k] * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            mhat, vhat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
            p[k] = p[k] - lr * mhat / (np.sqrt(vhat) + eps)
    return p


def np_ema(ema, params_seq, decay, interval):
    """EMA after steps 1..N (params_seq[i] = params after step i+1)."""
    ema, n = ema.astype(np.float64), 0
    for step, p in enumerate(params_seq, start=1):
        if interval > 0 and step % interval == 0:
            n += 1
            d = min((1 + n) / (10 + n), decay)
            ema = ema + (1 - d) * (p - ema)
    return ema


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


# ---------- schedules ----------

@pytest.mark.parametrize("schedule,warmup,total,min_ratio", [
    ("constant", 0, None, 0.0), ("constant", 4, None, 0.0),
    ("cosine", 3, 12, 0.0), ("cosine", 0, 10, 0.1)])
def test_schedule_matches_numpy(schedule, warmup, total, min_ratio):
    lr_at = make_lr_schedule(2e-3, warmup, schedule, total, min_ratio)
    counts = np.arange(0, 16)
    want = [np_lr(c, 2e-3, warmup, schedule, total, min_ratio) for c in counts]
    got = [float(lr_at(int(c))) for c in counts]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(lr_at))(jnp.asarray(counts))), want,
                               rtol=1e-6, atol=1e-12)


def test_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="cosin"):
        make_lr_schedule(1e-3, schedule="cosin")
    with pytest.raises(ValueError, match="total_steps"):
        make_lr_schedule(1e-3, warmup_steps=5, schedule="cosine", total_steps=None)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        make_optimizer(1e-3, grad_accum_steps=0)


# ---------- AdamW + clipping ----------

def _grads(rng, n, scales):
    return [{"w": (rng.standard_normal((3, 4)) * s).astype(np.float32),
             "b": (rng.standard_normal((4,)) * s).astype(np.float32)} for s in scales[:n]]


def _run(tx, params, grads_seq):
    p = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(p)
    step = jax.jit(lambda p, s, g: apply_gradients(tx, p, s, g))
    infos = []
    for g in grads_seq:
        p, state, info = step(p, state, {k: jnp.asarray(v) for k, v in g.items()})
        infos.append(info)
    return p, infos


def test_adamw_warmup_cosine_clip_matches_numpy(rng):
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32),
              "b": rng.standard_normal((4,)).astype(np.float32)}
    grads = _grads(rng, 6, [10.0, 0.3, 5.0, 0.1, 2.0, 0.05])   # some above the clip norm
    kw = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8, warmup_steps=2,
              schedule="cosine", total_steps=6)
    lrs = [np_lr(c, 1e-2, 2, "cosine", 6) for c in range(6)]
    got, infos = _run(make_optimizer(**kw, grad_norm_clip=1.0), params, grads)
    want = np_adamw(params, grads, lrs, 0.9, 0.99, 1e-8, 0.1, clip=1.0)
    for k in params:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6)
    # grad_norm is the pre-clip norm
    np.testing.assert_allclose(float(infos[0]["grad_norm"]),
                               math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2))
                                             for x in grads[0].values())), rtol=1e-5)
    # clipping really changed the trajectory (so the comparison above can fail)
    unclipped = np_adamw(params, grads, lrs, 0.9, 0.99, 1e-8, 0.1, clip=None)
    assert np.max(np.abs(unclipped["w"] - want["w"])) > 1e-4
    got0, _ = _run(make_optimizer(**kw, grad_norm_clip=0), params, grads)
    np.testing.assert_allclose(np.asarray(got0["w"]), unclipped["w"], rtol=1e-5, atol=1e-6)


def test_accumulation_equals_mean_gradient_step(rng):
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32),
              "b": rng.standard_normal((4,)).astype(np.float32)}
    micro = _grads(rng, 6, [1.0, 3.0, 0.5, 2.0, 1.0, 4.0])
    means = [{k: np.mean([g[k] for g in micro[i:i + 3]], axis=0) for k in params}
             for i in (0, 3)]
    kw = dict(lr=1e-2, weight_decay=0.01, grad_norm_clip=1.0, warmup_steps=1,
              schedule="cosine", total_steps=2)
    tx = make_optimizer(**kw, grad_accum_steps=3)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(p)
    step = jax.jit(lambda p, s, g: apply_gradients(tx, p, s, g))
    updated, snapshots, norms = [], [], []
    for g in micro:
        p, state, info = step(p, state, {k: jnp.asarray(v) for k, v in g.items()})
        updated.append(bool(info["updated"]))
        snapshots.append(np.asarray(p["w"]))
        norms.append(float(info["grad_norm"]))
    assert updated == [False, False, True, False, False, True]
    np.testing.assert_array_equal(snapshots[0], params["w"])       # no update mid-window
    np.testing.assert_array_equal(snapshots[1], params["w"])
    ref, _ = _run(make_optimizer(**kw), params, means)
    for k in params:
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(ref[k]), rtol=1e-6, atol=1e-7)
    for i, mean in zip((2, 5), means):   # reported norm = norm of the applied mean gradient
        want = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in mean.values()))
        np.testing.assert_allclose(norms[i], want, rtol=1e-5)


def test_works_with_nnx_optimizer_on_lora_params():
    class Tiny(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((2, 3)))
            self.a = nnx.LoRAParam(jnp.full((2, 3), 0.5))

        def __call__(self, x):
            return x @ (self.w[...] + self.a[...])

    model = Tiny()
    opt = nnx.Optimizer(model, make_optimizer(0.1, grad_accum_steps=2), wrt=nnx.LoRAParam)
    x = jnp.arange(4.0).reshape(2, 2)

    def loss(m):
        return jnp.sum(m(x) ** 2)

    @nnx.jit
    def step(model, opt):
        grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
        opt.update(model, grads)

    a0 = np.asarray(model.a[...])
    for i in range(2):
        step(model, opt)
        if i == 0:
            np.testing.assert_array_equal(np.asarray(model.a[...]), a0)
    assert not np.allclose(np.asarray(model.a[...]), a0)
    np.testing.assert_array_equal(np.asarray(model.w[...]), np.ones((2, 3)))


# ---------- EMA ----------

@pytest.mark.parametrize("interval", [1, 3, 0])
def test_ema_matches_numpy_rule(rng, interval):
    seq = [rng.standard_normal((5,)).astype(np.float32) for _ in range(14)]
    init = rng.standard_normal((5,)).astype(np.float32)
    # traced step AND traced interval: one compilation, no Python branching on values
    upd = jax.jit(lambda e, p, s, i: ema_update(e, p, s, 0.9, i))
    ema = {"x": jnp.asarray(init)}
    for step, p in enumerate(seq, start=1):
        ema = upd(ema, {"x": jnp.asarray(p)}, step, interval)
    np.testing.assert_allclose(np.asarray(ema["x"]), np_ema(init, seq, 0.9, interval),
                               rtol=1e-5, atol=1e-6)
    if interval == 0:   # Python 0 is a plain no-op too
        e = {"x": jnp.asarray(init)}
        assert ema_update(e, {"x": jnp.asarray(seq[0])}, 10, 0.9, 0) is e
        np.testing.assert_array_equal(np.asarray(ema["x"]), init)


def test_ema_keeps_dtype_and_init_copies():
    params = {"a": jnp.ones((4,), jnp.bfloat16), "b": jnp.zeros((2,), jnp.float32)}
    ema = ema_init(params)
    for k in params:
        assert ema[k].unsafe_buffer_pointer() != params[k].unsafe_buffer_pointer()
        assert ema[k].sharding == params[k].sharding
    new = ema_update(ema, jax.tree.map(lambda x: x + 1, params), 1, 0.9, 1)
    assert new["a"].dtype == jnp.bfloat16
    d = 2 / 11   # first update: min((1+1)/(10+1), 0.9)
    np.testing.assert_allclose(np.asarray(new["b"]), np.full((2,), 1 - d), rtol=1e-6)


def test_soft_update_matches_numpy(rng):
    old = rng.standard_normal((3, 3)).astype(np.float32)
    new = rng.standard_normal((3, 3)).astype(np.float32)
    for eta in (0.0, 0.3, 1.0):
        got = soft_update({"x": jnp.asarray(old)}, {"x": jnp.asarray(new)}, eta)["x"]
        np.testing.assert_allclose(np.asarray(got), eta * old + (1 - eta) * new, rtol=1e-6)


def test_train_state_update_counts_real_updates_and_emas_them(rng):
    params = {"w": rng.standard_normal((3,)).astype(np.float32)}
    tx = make_optimizer(0.05, grad_accum_steps=2)
    state = TrainState.create(jax.tree.map(jnp.asarray, params), tx, jax.random.key(0), ema=True)
    step = jax.jit(lambda s, g: train_state_update(s, g, tx, ema_decay=0.9, ema_interval=1),
                   donate_argnums=0)
    after_updates = []
    for _i in range(6):
        state, info = step(state, {"w": jnp.asarray(rng.standard_normal((3,)), jnp.float32)})
        if bool(info["updated"]):
            after_updates.append(np.asarray(state.params["w"]))
    assert int(state.step) == 3 and len(after_updates) == 3
    np.testing.assert_allclose(np.asarray(state.ema["w"]),
                               np_ema(params["w"], after_updates, 0.9, 1), rtol=1e-5, atol=1e-6)
