"""sampling/edm.py against a float64 numpy EDM sampler written here from cosmos_rl_wfm.md §1 and
algorithms.md §4: the sigma grid, churn, the 2ab / Euler / Heun steps, the full trajectory, the
trajectory records the RL step reads, and same-initial-noise groups."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.sampling import edm

SHAPE = (4, 3, 2, 5)  # (B, C, T, W): the sampler takes any rank
C = SHAPE[1]


# ----------------------------------------------------------------------------- numpy reference


def np_grid(n, smin=0.01, smax=200.0, rho=7.0):
    return np.array([(smax ** (1 / rho) + i / n * (smin ** (1 / rho) - smax ** (1 / rho))) ** rho
                     for i in range(n + 1)])


def np_euler(x, s, t, x0):
    return (s - t) / s * x0 + t / s * x


def np_ab2(x, s, t, x0, sp, x0p):
    lam, lam_t, lam_p = -np.log(s), -np.log(t), -np.log(sp)
    h = lam_t - lam
    c2 = (lam_p - lam) / h
    phi1 = (np.exp(-h) - 1) / (-h)
    phi2 = (phi1 - 1) / (-h)
    return np.exp(-h) * x + h * ((phi1 - phi2 / c2) * x0 + phi2 / c2 * x0p)


def weights():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((C, C)) / math.sqrt(C)).astype(np.float32)


W = weights()


def jax_net(x_in, t):
    """A small nonlinear RF 'network': channel mixing, tanh, a time-dependent shift."""
    h = jnp.einsum("cd,bd...->bc...", jnp.asarray(W), x_in)
    return jnp.tanh(h) + t.reshape((-1,) + (1,) * (x_in.ndim - 1)) - 0.3 * x_in


def np_net(x_in, t):
    h = np.einsum("cd,bd...->bc...", W.astype(np.float64), x_in)
    return np.tanh(h) + np.reshape(t, (-1,) + (1,) * (x_in.ndim - 1)) - 0.3 * x_in


def np_x0(x, sigma):
    """cosmos RectifiedFlowScaling: t = s/(1+s), x0 = (1-t) x - t F((1-t) x, t)."""
    t = np.reshape(sigma / (1 + sigma), (-1,) + (1,) * (x.ndim - 1))
    return (1 - t) * x - t * np_net((1 - t) * x, t.reshape(-1))


def np_sample(eps, xis, n, solver, s_churn=1.0, s_noise=1.0, s_tmin=0.0, s_tmax=math.inf):
    """Algorithm 2 of EDM with cosmos's step rules, float64; returns per-step records."""
    sig = np_grid(n)
    eta = min(s_churn / (n + 1), math.sqrt(1.2) - 1)
    b = eps.shape[0]
    x = eps * 200.0
    rec = {"x_hat": [], "x0": [], "mu": [], "sigma_hat": []}
    prev = None
    for k in range(n):
        s, t = sig[k], sig[k + 1]
        s_hat = s + eta * s if s_tmin < s < s_tmax else s
        x_hat = x + math.sqrt(s_hat**2 - s**2) * s_noise * xis[k]
        x0 = np_x0(x_hat, np.full(b, s_hat))
        if solver == "2heun_edm":
            x_e = np_euler(x_hat, s_hat, t, x0)
            x0 = 0.5 * (x0 + np_x0(x_e, np.full(b, t)))
        if solver == "2ab" and prev is not None:
            mu = np_ab2(x_hat, s_hat, t, x0, prev[1], prev[0])
        else:
            mu = np_euler(x_hat, s_hat, t, x0)
        prev = (x0, s_hat)
        for name, v in (("x_hat", x_hat), ("x0", x0), ("mu", mu), ("sigma_hat", s_hat)):
            rec[name].append(v)
        x = mu
    rec = {k: np.asarray(v) for k, v in rec.items()}
    rec["final"] = np_x0(x, np.full(b, sig[-1]))
    return rec


def churn_noises(key, n, shape):
    """The documented churn-noise contract: step k draws normal(fold_in(key, k), shape)."""
    return np.stack([np.asarray(jax.random.normal(jax.random.fold_in(key, k), shape, jnp.float32),
                                np.float64) for k in range(n)])


@functools.lru_cache
def rollout(steps, solver="2ab", s_churn=1.0, record=True):
    """One compiled sampler per setting (compiles dominate these tests' time)."""
    plan = edm.make_plan(steps, solver=solver, s_churn=s_churn)
    return plan, jax.jit(lambda e, k: edm.sample(edm.rf_denoiser(jax_net), e, plan, k, record=record))


# ----------------------------------------------------------------------------- grid and churn


def test_sigma_grid_matches_the_formula_and_the_spec_values():
    for n in (1, 10, 20, 35):
        np.testing.assert_allclose(edm.sigma_grid(n), np_grid(n), rtol=1e-14)
    # cosmos_rl_wfm.md §1 (the spec prints 0.066792 for the 9th; the formula gives 0.066762)
    spec10 = [200, 115.27, 63.378, 32.951, 16.014, 7.1625, 2.8853, 1.0145, 0.29679, 0.066762, 0.01]
    np.testing.assert_allclose(edm.sigma_grid(10), spec10, rtol=2e-4)
    mid20 = [152.66, 86.020, 46.049, 23.186, 10.834, 4.6135, 1.7446, 0.56372, 0.14646, 0.027550]
    g20 = edm.sigma_grid(20)
    np.testing.assert_allclose(g20[1::2], mid20, rtol=2e-4)
    np.testing.assert_allclose(g20[::2], edm.sigma_grid(10), rtol=1e-12)
    assert edm.sigma_grid(10).dtype == np.float64


@pytest.mark.parametrize(("steps", "solver", "intervals"), [(10, "2ab", 10), (20, "2ab", 20),
                                                            (10, "2heun_edm", 5), (7, "1euler", 7)])
def test_plan_churns_every_step_by_eta(steps, solver, intervals):
    plan = edm.make_plan(steps, solver=solver)
    eta = min(1.0 / (intervals + 1), math.sqrt(1.2) - 1)
    assert plan.num_intervals == intervals
    assert plan.eta == pytest.approx(eta, rel=1e-15)
    sig = np_grid(intervals)
    np.testing.assert_allclose(plan.sigmas, sig, rtol=1e-14)
    np.testing.assert_allclose(plan.sigma_hat, (1 + eta) * sig[:-1], rtol=1e-14)
    np.testing.assert_allclose(plan.churn_std, np.sqrt(((1 + eta) ** 2 - 1) * sig[:-1] ** 2), rtol=1e-12)
    want_std = np.append(sig[1:-1] * math.sqrt(eta**2 + 2 * eta), 0.0)
    np.testing.assert_allclose(plan.transition_std(), want_std, rtol=1e-12)


def test_churn_respects_s_t_min_max_and_the_eta_cap():
    assert edm.make_plan(10).eta == pytest.approx(1 / 11)
    assert edm.make_plan(20).eta == pytest.approx(1 / 21)
    assert edm.make_plan(10, s_churn=50.0).eta == pytest.approx(math.sqrt(1.2) - 1)
    plan = edm.make_plan(10, s_t_min=1.0, s_t_max=100.0, s_noise=1.5)
    sig = np_grid(10)[:-1]
    on = (sig > 1.0) & (sig < 100.0)
    assert on.any()
    assert not on.all()
    np.testing.assert_allclose(plan.sigma_hat, np.where(on, sig * (1 + 1 / 11), sig), rtol=1e-14)
    np.testing.assert_allclose(plan.churn_std, np.where(on, sig * math.sqrt((12 / 11) ** 2 - 1) * 1.5, 0.0),
                               rtol=1e-12)
    off = edm.make_plan(10, s_churn=0.0)
    np.testing.assert_array_equal(off.churn_std, 0.0)
    np.testing.assert_array_equal(off.sigma_hat, off.sigmas[:-1])


def test_churn_function_matches_numpy():
    rng = np.random.default_rng(0)
    x, xi = rng.standard_normal((2, *SHAPE)).astype(np.float32)
    s = np.array([3.0, 1.0, 0.5, 2.0], np.float32)
    s_hat = s * 1.1
    got = edm.churn(jnp.asarray(x), s_hat, s, jnp.asarray(xi), 0.9)
    want = x + (np.sqrt(s_hat.astype(np.float64) ** 2 - s**2) * 0.9)[:, None, None, None] * xi
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- step rules


def test_step_rules_match_numpy_per_row():
    rng = np.random.default_rng(1)
    x, x0, x0p = (rng.standard_normal(SHAPE) for _ in range(3))
    s = np.array([50.0, 7.0, 1.2, 0.3])
    t = s * np.array([0.5, 0.4, 0.6, 0.2])
    sp = s * np.array([1.8, 2.5, 1.3, 4.0])
    col = (slice(None), None, None, None)
    f32 = [jnp.asarray(a, jnp.float32) for a in (x, x0, x0p)]
    got = edm.euler_x0_step(f32[0], s, t, f32[1])
    np.testing.assert_allclose(np.asarray(got), np_euler(x, s[col], t[col], x0), rtol=1e-5, atol=1e-5)
    got = edm.ab2_x0_step(f32[0], s, t, f32[1], sp, f32[2])
    want = np_ab2(x, s[col], t[col], x0, sp[col], x0p)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    # step_mean: per-row `first` picks Euler on those rows, the 2ab step on the others
    x0_fn = edm.rf_denoiser(jax_net)
    first = np.array([True, False, True, False])
    mu, x0_got = edm.step_mean(x0_fn, f32[0], s, t, x0_prev=f32[2], sigma_prev=sp, first=first)
    x0_np = np_x0(x, s)
    np.testing.assert_allclose(np.asarray(x0_got), x0_np, rtol=1e-5, atol=1e-5)
    want = np.where(first[col], np_euler(x, s[col], t[col], x0_np),
                    np_ab2(x, s[col], t[col], x0_np, sp[col], x0p))
    np.testing.assert_allclose(np.asarray(mu), want, rtol=1e-4, atol=1e-5)
    mu_h, x0_h = edm.step_mean(x0_fn, f32[0], s, t, solver="2heun_edm")
    avg = 0.5 * (x0_np + np_x0(np_euler(x, s[col], t[col], x0_np), t))
    np.testing.assert_allclose(np.asarray(x0_h), avg, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(mu_h), np_euler(x, s[col], t[col], avg), rtol=1e-5, atol=1e-5)


def test_rf_denoiser_feeds_t_not_1000t():
    seen = {}

    def net(x_in, t):
        seen["t"] = t
        return jnp.zeros_like(x_in)

    x = jnp.ones((2, 3))
    out = edm.rf_denoiser(net)(x, jnp.asarray([1.0, 3.0]))
    np.testing.assert_allclose(np.asarray(seen["t"]), [0.5, 0.75], rtol=1e-7)
    np.testing.assert_allclose(np.asarray(out), [[0.5] * 3, [0.25] * 3], rtol=1e-7)
    edm.rf_denoiser(net, timestep_scale=1000.0)(x, jnp.asarray([1.0, 3.0]))
    np.testing.assert_allclose(np.asarray(seen["t"]), [500.0, 750.0], rtol=1e-7)


def test_cosmos_guidance_form():
    x = jnp.asarray(np.random.default_rng(2).standard_normal(SHAPE), jnp.float32)
    sig = jnp.full((4,), 2.0)

    def cond(x, s):
        return 0.5 * x

    def uncond(x, s):
        return -0.25 * x

    assert edm.cosmos_guided(cond, None, 0.0) is cond  # guidance 0: one conditional pass
    got = edm.cosmos_guided(cond, uncond, 3.0)(x, sig)
    want = 0.5 * np.asarray(x) + 3.0 * (0.5 - -0.25) * np.asarray(x)  # c + g (c - u)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    with pytest.raises(ValueError, match="unconditional"):
        edm.cosmos_guided(cond, None, 1.0)


# ----------------------------------------------------------------------------- the rollout


@pytest.mark.parametrize(("solver", "steps"), [("2ab", 10), ("2ab", 20), ("1euler", 6), ("2heun_edm", 10)])
def test_full_trajectory_matches_numpy(solver, steps):
    plan, run = rollout(steps, solver)
    key, k_noise = jax.random.key(3), jax.random.key(4)
    eps = edm.initial_noise(k_noise, SHAPE)
    traj = run(eps, key)
    n = plan.num_intervals
    ref = np_sample(np.asarray(eps, np.float64), churn_noises(key, n, SHAPE), n, solver)
    assert traj.x_hat.shape == (n, *SHAPE)
    assert traj.final.shape == SHAPE
    np.testing.assert_allclose(np.asarray(traj.sigma_hat), ref["sigma_hat"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(traj.sigma_next), np_grid(n)[1:], rtol=1e-6)
    for name in ("x_hat", "x0", "mu"):
        scale = np.abs(ref[name]).max(axis=tuple(range(1, ref[name].ndim)), keepdims=True)
        np.testing.assert_allclose(np.asarray(getattr(traj, name)) / scale, ref[name] / scale, atol=2e-5,
                                   err_msg=name)
    np.testing.assert_allclose(np.asarray(traj.final), ref["final"], atol=5e-5)
    np.testing.assert_array_equal(np.asarray(traj.noise), np.asarray(eps))


def test_same_key_same_rollout_other_key_other_rollout():
    _, run = rollout(4)
    eps = edm.initial_noise(jax.random.key(0), SHAPE)
    a, b, c = (run(eps, jax.random.key(i)) for i in (1, 1, 2))
    np.testing.assert_array_equal(np.asarray(a.final), np.asarray(b.final))
    assert np.abs(np.asarray(a.final) - np.asarray(c.final)).max() > 1e-3
    final_only = rollout(4, record=False)[1](eps, jax.random.key(1))
    np.testing.assert_allclose(np.asarray(final_only), np.asarray(a.final), rtol=1e-5, atol=1e-5)


def test_trajectory_step_records_what_the_rl_step_reads():
    plan, run = rollout(6)
    fn = edm.rf_denoiser(jax_net)
    traj = run(edm.initial_noise(jax.random.key(0), SHAPE), jax.random.key(1))
    pick = jax.jit(edm.trajectory_step)
    for k in range(6):
        st = pick(traj, k)
        np.testing.assert_array_equal(np.asarray(st.noise_x), np.asarray(traj.x_hat[k]))
        want_next = traj.final if k == 5 else traj.x_hat[k + 1]  # cosmos: last `sample` = clean output
        np.testing.assert_array_equal(np.asarray(st.sample), np.asarray(want_next))
        np.testing.assert_array_equal(np.asarray(st.mu_old), np.asarray(traj.mu[k]))
        assert bool(st.first) == (k == 0)
        assert float(st.sigma) == float(traj.sigma_hat[k])
        assert float(st.sigma_next) == float(traj.sigma_next[k])
        if k:
            np.testing.assert_array_equal(np.asarray(st.x0_prev), np.asarray(traj.x0[k - 1]))
            assert float(st.sigma_prev) == float(traj.sigma_hat[k - 1])
        # the churned state x_hat_{k+1} is mu_k plus the next step's churn
        if k < 5:
            gap = np.asarray(st.sample - st.mu_old)
            assert 0 < np.std(gap) < 3 * plan.transition_std()[k]
        # recomputing the step from the record with the same weights gives the stored mean
        mu, _ = edm.step_mean(fn, st.noise_x, st.sigma, st.sigma_next, x0_prev=st.x0_prev,
                              sigma_prev=st.sigma_prev, first=st.first)
        np.testing.assert_allclose(np.asarray(mu), np.asarray(st.mu_old), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- initial noise


def test_same_initial_noise_within_a_group_only():
    key = jax.random.key(5)
    ids = edm.contiguous_group_ids(8, 4)
    np.testing.assert_array_equal(ids, [0, 0, 0, 0, 1, 1, 1, 1])
    eps = np.asarray(edm.initial_noise(key, (8, 3, 4), ids))
    for g in (0, 1):
        rows = eps[ids == g]
        np.testing.assert_array_equal(rows, np.broadcast_to(rows[0], rows.shape))
    assert np.abs(eps[0] - eps[4]).min() > 0
    # a group's noise does not depend on where its rows sit
    shuffled = np.array([1, 0, 1, 0, 0, 1, 1, 0])
    eps2 = np.asarray(edm.initial_noise(key, (8, 3, 4), shuffled))
    np.testing.assert_array_equal(eps2[shuffled == 0][0], eps[0])
    np.testing.assert_array_equal(eps2[shuffled == 1][0], eps[4])
    # without groups every row differs
    free = np.asarray(edm.initial_noise(key, (8, 3, 4)))
    assert len({free[i].tobytes() for i in range(8)}) == 8
    assert abs(free.std() - 1) < 0.2
    assert abs(eps.std() - 1) < 0.3


def test_same_initial_noise_members_still_diverge_through_churn():
    eps = edm.initial_noise(jax.random.key(0), SHAPE, edm.contiguous_group_ids(4, 4))
    traj = rollout(4)[1](eps, jax.random.key(1))
    x_hat0 = np.asarray(traj.x_hat[0])
    assert np.abs(x_hat0[0] - x_hat0[1]).max() > 1.0  # churn std at step 0 is ~88
    off = rollout(4, s_churn=0.0)[1](eps, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(off.final[0]), np.asarray(off.final[1]))


def test_bad_inputs_raise_one_clear_error():
    with pytest.raises(ValueError, match="unknown EDM solver"):
        edm.make_plan(10, solver="heun")
    with pytest.raises(ValueError, match="no interval"):
        edm.make_plan(1, solver="2heun_edm")
    with pytest.raises(ValueError, match="sigma_min < sigma_max"):
        edm.sigma_grid(10, sigma_min=300.0)
    with pytest.raises(ValueError, match="groups of 3"):
        edm.contiguous_group_ids(8, 3)
    with pytest.raises(ValueError, match="group_ids has shape"):
        edm.initial_noise(jax.random.key(0), (4, 2), np.zeros(3, int))
    with pytest.raises(ValueError, match="x0_prev and sigma_prev"):
        edm.step_mean(edm.rf_denoiser(jax_net), jnp.ones(SHAPE), 2.0, 1.0, first=False)
