"""Schedules and samplers against diffusers and against independent float64 numpy references of
spec algorithms.md. The velocity field is the exact flow-matching velocity of Gaussian data
x0 ~ N(m, s^2) (linear in x), written once for numpy, torch and jax.

Sampler keys use the "rbg" PRNG implementation: the samplers are key-type agnostic and threefry's
XLA CPU compile dominates test time otherwise.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

from wfm_jax.sampling import steps as S
from wfm_jax.sampling.guidance import guided_velocity
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import edm_churn_eta, edm_sigmas, flow_sigmas, training_table

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

SHAPE = (2, 3, 4, 4)
S2 = 0.25  # data variance


def gauss_v(x, sigma, m):
    """E[eps - x0 | x_sigma] for x0 ~ N(m, S2): works for numpy, torch and jax arrays."""
    var = (1 - sigma) ** 2 * S2 + sigma**2
    r = x - (1 - sigma) * m
    return sigma * r / var - (m + (1 - sigma) * S2 * r / var)


def jax_velocity(x, timesteps, cond):
    sigma = (timesteps / 1000.0)[:, None, None, None]
    return gauss_v(x, sigma, cond["m"][:, None, None, None])


M = np.array([0.7, -0.4], np.float32)
COND = {"m": jnp.asarray(M)}


def np_v(x, sigma):
    return gauss_v(x, np.float64(sigma), M.astype(np.float64)[:, None, None, None])


@pytest.fixture(scope="module")
def x_init():
    return np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)


def rbg(seed):
    return jax.random.key(seed, impl="rbg")


# ----------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("shift", [1.0, 3.0, 4.5])
@pytest.mark.parametrize("n", [1, 4, 10, 28, 40])
def test_flow_sigmas_match_diffusers(shift, n):
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(n)
    sigmas, timesteps = flow_sigmas(n, shift)
    assert sigmas.dtype == np.float32 and timesteps.dtype == np.float32
    np.testing.assert_array_equal(sigmas, sched.sigmas.numpy())
    np.testing.assert_array_equal(timesteps, sched.timesteps.numpy())


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_training_table_matches_diffusers(shift):
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    timesteps, sigmas = training_table(shift)
    np.testing.assert_array_equal(timesteps, sched.timesteps.numpy())
    np.testing.assert_array_equal(sigmas, sched.sigmas.numpy())


def test_edm_sigmas_formula():
    n, lo, hi, rho = 20, 0.01, 200.0, 7.0
    got = edm_sigmas(n, lo, hi, rho)
    want = np.array([(hi ** (1 / rho) + i / n * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho for i in range(n + 1)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[0] == pytest.approx(hi) and got[-1] == pytest.approx(lo)
    assert edm_churn_eta(1.0, n) == pytest.approx(1 / 21)
    assert edm_churn_eta(100.0, n) == pytest.approx(math.sqrt(1.2) - 1)
    with pytest.raises(ValueError, match="sigma_min"):
        edm_sigmas(n, 1.0, 0.5)


# ----------------------------------------------------------------------------- Euler, SDE


@pytest.fixture(scope="module")
def sde_run():
    """One compiled SDE sampler; noise_level is an argument so a = 0 reuses it."""
    sigmas, _ = flow_sigmas(10)
    fn = jax.jit(lambda x, k, a: sample(jax_velocity, x, sigmas, k, method="sde", cond=COND, noise_level=a, return_trajectory=True))
    return sigmas, fn


def test_euler_matches_diffusers_scheduler(x_init):
    sigmas, _ = flow_sigmas(10)
    out = jax.jit(lambda x: sample(jax_velocity, x, sigmas, method="euler", cond=COND, return_trajectory=True))(x_init)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(10)
    x = torch.from_numpy(x_init)
    m = torch.from_numpy(M)[:, None, None, None]
    for t in sched.timesteps:
        x = sched.step(gauss_v(x, t / 1000.0, m), t, x).prev_sample
    np.testing.assert_allclose(np.asarray(out.latents), x.numpy(), atol=2e-6)
    np.testing.assert_array_equal(np.asarray(out.trajectory[-1]), np.asarray(out.latents))
    assert not np.asarray(out.stochastic).any() and not np.asarray(out.log_probs).any()


def test_sde_step_logprob_matches_numpy_gaussian(x_init, sde_run):
    sigmas, fn = sde_run
    a = 0.7
    out = fn(x_init, rbg(1), a)
    traj = np.asarray(out.trajectory, np.float64)
    s64 = sigmas.astype(np.float64)
    assert np.asarray(out.stochastic).all()
    for i in range(10):
        s, sn = s64[i], s64[i + 1]
        x = traj[i]
        v = np_v(x, sigmas[i])
        dt = sn - s
        std_dev_t = a * math.sqrt(s / (1 - (s64[1] if s == 1 else s)))  # sigma == 1 -> sigma_1
        mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
        std = std_dev_t * math.sqrt(-dt)
        np.testing.assert_allclose(np.asarray(out.means[i]), mean, atol=2e-5, err_msg=f"mean step {i}")
        assert float(out.stds[i]) == pytest.approx(std, rel=1e-5)
        # the taken step is mean + std * noise
        np.testing.assert_allclose(traj[i + 1], np.asarray(out.means[i]) + std * np.asarray(out.noises[i]), atol=2e-6)
        x_next, mu = traj[i + 1], np.asarray(out.means[i], np.float64)
        lp = -((x_next - mu) ** 2) / (2 * std**2) - math.log(std) - math.log(math.sqrt(2 * math.pi))
        np.testing.assert_allclose(np.asarray(out.log_probs[i]), lp.mean(axis=(1, 2, 3)), rtol=1e-5, atol=1e-5)
    x0 = traj[0] - 1.0 * np_v(traj[0], 1.0)
    np.testing.assert_allclose(np.asarray(out.x0[0]), x0, atol=2e-6)


def test_sde_training_logprob_reproduces_rollout(x_init, sde_run):
    """Re-evaluating a stored step with steps.sde_log_prob gives the rollout's log-prob (ratio 1)."""
    sigmas, fn = sde_run
    out = fn(x_init, rbg(2), 0.7)

    @jax.jit
    def relogprob(traj):
        def one(i):
            x = traj[i]
            v = jax_velocity(x, jnp.full((SHAPE[0],), sigmas[i] * np.float32(1000)), COND)
            lp, _, _ = S.sde_log_prob(traj[i + 1], x, v, sigmas[i], sigmas[i + 1], 0.7, sigmas[1])
            return lp

        return jnp.stack([one(i) for i in range(10)])

    np.testing.assert_allclose(np.asarray(relogprob(out.trajectory)), np.asarray(out.log_probs), rtol=0, atol=1e-6)


def test_sde_with_zero_noise_is_the_euler_path(x_init, sde_run):
    sigmas, fn = sde_run
    sde = fn(x_init, rbg(3), 0.0)
    ode = jax.jit(lambda x: sample(jax_velocity, x, sigmas, method="euler", cond=COND, return_trajectory=True))(x_init)
    np.testing.assert_allclose(np.asarray(sde.trajectory), np.asarray(ode.trajectory), rtol=0, atol=1e-6)
    assert np.isfinite(np.asarray(sde.log_probs)).all()
    # without the trajectory the same key gives the same final latents
    full = fn(x_init, rbg(3), 0.7)
    lean = jax.jit(lambda x, k: sample(jax_velocity, x, sigmas, k, method="sde", cond=COND, noise_level=0.7))(x_init, rbg(3))
    assert lean.trajectory is None and lean.log_probs is None
    np.testing.assert_allclose(np.asarray(lean.latents), np.asarray(full.latents), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- CPS window, Dance


def test_cps_window_is_ode_outside_and_cps_inside(x_init):
    sigmas, _ = flow_sigmas(10)
    a, size = 0.8, 3
    fn = jax.jit(lambda x, k, start: sample(jax_velocity, x, sigmas, k, method="cps", cond=COND, noise_level=a, sde_window_start=start, sde_window_size=size, return_trajectory=True))
    for start in (0, 6):
        out = fn(x_init, rbg(4), start)
        flags = np.asarray(out.stochastic)
        np.testing.assert_array_equal(flags, [start <= i < start + size for i in range(10)])
        traj = np.asarray(out.trajectory, np.float64)
        for i in range(10):
            s, sn = float(sigmas[i]), float(sigmas[i + 1])
            x = traj[i]
            v = np_v(x, sigmas[i])
            if not flags[i]:
                np.testing.assert_allclose(traj[i + 1], x + (sn - s) * v, atol=2e-6, err_msg=f"ode step {i}")
                assert not np.asarray(out.log_probs[i]).any() and not np.asarray(out.noises[i]).any()
                continue
            std = sn * math.sin(a * math.pi / 2)
            mean = (x - s * v) * (1 - sn) + (x + (1 - s) * v) * math.sqrt(max(sn**2 - std**2, 0.0))
            np.testing.assert_allclose(np.asarray(out.means[i]), mean, atol=2e-5)
            np.testing.assert_allclose(traj[i + 1], np.asarray(out.means[i]) + std * np.asarray(out.noises[i]), atol=2e-6)
            lp = -((traj[i + 1] - np.asarray(out.means[i], np.float64)) ** 2).mean(axis=(1, 2, 3))
            np.testing.assert_allclose(np.asarray(out.log_probs[i]), lp, rtol=1e-5, atol=1e-9)


def test_dance_step_matches_numpy():
    rng = np.random.default_rng(5)
    x, v, noise = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
    s, sn, eta = 0.6, 0.45, 0.3
    x_next, lp, mean, std = jax.jit(S.dance_step)(jnp.asarray(x), jnp.asarray(v), s, sn, jnp.asarray(noise), eta)
    x64, v64 = x.astype(np.float64), v.astype(np.float64)
    x0 = x64 - s * v64
    score = -(x64 - x0 * (1 - s)) / s**2
    want_mean = x64 + (sn - s) * v64 - 0.5 * eta**2 * score * (sn - s)
    want_std = eta * math.sqrt(s - sn)
    np.testing.assert_allclose(np.asarray(mean), want_mean, atol=1e-6)
    assert float(std) == pytest.approx(want_std, rel=1e-6)
    want_next = want_mean + want_std * noise
    np.testing.assert_allclose(np.asarray(x_next), want_next, atol=1e-6)
    want_lp = (-((np.asarray(x_next, np.float64) - np.asarray(mean, np.float64)) ** 2) / (2 * want_std**2)).mean(axis=(1, 2, 3))
    np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=1e-5)


# ----------------------------------------------------------------------------- DPM-Solver++(2M)


def _dpm_numpy(x, sigmas):
    """DiffusionNFT's dpm2 data-collection solver in float64: DDIM at the first and last step,
    DPM-Solver++ 2M (midpoint) with lambda = log((1 - s)/s) in between."""
    s64 = np.asarray(sigmas, np.float64)
    x = x.astype(np.float64)
    lam = lambda s: np.log(1 - s) - np.log(s)
    prev_x0, n = None, len(s64) - 1
    with np.errstate(divide="ignore"):
        for i in range(n):
            s, t = s64[i], s64[i + 1]
            x0 = x - s * np_v(x, np.float32(sigmas[i]))
            if i == 0 or i == n - 1:
                x = (1 - t) * x0 + t * (x - (1 - s) * x0) / s  # DDIM, eta = 0
            else:
                h, h0 = lam(t) - lam(s), lam(s) - lam(s64[i - 1])
                d1 = (h / h0) * (x0 - prev_x0)  # h0 = inf when the previous sigma is 1
                x = (t / s) * x - (1 - t) * (np.exp(-h) - 1) * (x0 + 0.5 * d1)
            prev_x0 = x0
    return x


def _dpm_diffusers(x, sigmas_override=None):
    """diffusers DPMSolverMultistepScheduler configured as DPM-Solver++(2M) for flow models."""
    sched = DPMSolverMultistepScheduler(
        algorithm_type="dpmsolver++",
        solver_order=2,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=3.0,
        lower_order_final=True,
        final_sigmas_type="zero",
    )
    sched.set_timesteps(10)
    if sigmas_override is not None:
        sched.sigmas = torch.from_numpy(sigmas_override)
    sigmas = sched.sigmas.numpy()
    xt, m = torch.from_numpy(x), torch.from_numpy(M)[:, None, None, None]
    for i, t in enumerate(sched.timesteps):
        v = gauss_v(xt, torch.tensor(sigmas[i] * np.float32(1000)) / 1000.0, m)
        xt = sched.step(v, t, xt).prev_sample
    return sigmas, xt.numpy()


def test_dpm2_matches_diffusers_and_numpy_reference(x_init):
    fn = jax.jit(lambda x, sig: sample(jax_velocity, x, sig, method="dpm2", cond=COND).latents)
    flow_grid, _ = flow_sigmas(10)
    for override in (None, flow_grid):  # diffusers' own flow grid, then the SD3 grid (sigma_0 = 1)
        sigmas, want = _dpm_diffusers(x_init, override)
        got = np.asarray(fn(x_init, sigmas))
        np.testing.assert_allclose(got, want, atol=2e-5)
        np.testing.assert_allclose(got, _dpm_numpy(x_init, sigmas), atol=2e-5)


def test_dpm2_coefficients_first_and_last_order():
    # step 0 from sigma = 1 is DDIM: x' = s' x + (1 - s') x0; last step to 0 returns x0.
    a, b, c = S.dpm2_coefficients(1.0, 1.0, 0.9, False)
    assert (float(a), float(b), float(c)) == pytest.approx((0.9, 0.1, 0.0))
    a, b, c = S.dpm2_coefficients(0.3, 0.1, 0.0, False)
    assert (float(a), float(b), float(c)) == pytest.approx((0.0, 1.0, 0.0))
    # a second-order step after sigma = 1 degenerates to first order (lambda(1) = -inf)
    assert float(S.dpm2_coefficients(1.0, 0.9, 0.8, True)[2]) == 0.0


# ----------------------------------------------------------------------------- EDM (DDRL)


def _edm_numpy(x, sigmas, noises, eta, s_noise=1.0):
    """cosmos-rl DDRL rollout in float64: churn, RF-scaled x0, Euler then res_x0_rk2 (2ab)."""
    x = x.astype(np.float64)
    prev, hats, means = None, [], []

    def x0_fn(x, s):
        t = s / (1 + s)
        return (1 - t) * x - t * np_v((1 - t) * x, np.float32(t))

    for i in range(len(sigmas) - 1):
        s, sn = sigmas[i], sigmas[i + 1]
        s_hat = s + eta * s
        x = x + math.sqrt(s_hat**2 - s**2) * s_noise * noises[i]
        s = s_hat
        hats.append(x)
        x0 = x0_fn(x, s)
        if prev is None:
            x = (s - sn) / s * x0 + sn / s * x
        else:
            x0_p, s_p = prev
            ls, lt, lm = -math.log(s), -math.log(sn), -math.log(s_p)
            dt = lt - ls
            c2 = (lm - ls) / dt
            phi1 = math.expm1(-dt) / -dt
            phi2 = (phi1 - 1) / -dt
            x = math.exp(-dt) * x + dt * ((phi1 - phi2 / c2) * x0 + phi2 / c2 * x0_p)
        prev = (x0, s)
        means.append(x)
    return np.stack(hats), np.stack(means), x0_fn(x, sigmas[-1])


def test_edm_sampler_matches_numpy_reference(x_init):
    n = 8
    sigmas = edm_sigmas(n, 0.01, 200.0)
    eta = edm_churn_eta(1.0, n)
    out = jax.jit(lambda x, k: sample(jax_velocity, x, sigmas, k, method="edm", cond=COND, return_trajectory=True))(
        x_init * np.float32(200.0), rbg(6)
    )
    noises = np.asarray(out.noises, np.float64)
    sig32 = np.asarray(sigmas, np.float32).astype(np.float64)  # the sampler runs on fp32 sigmas
    hats, means, final = _edm_numpy(x_init * 200.0, sig32, noises, eta)
    scale = np.abs(hats).max(axis=(1, 2, 3, 4), keepdims=True)
    np.testing.assert_allclose(np.asarray(out.trajectory[:n]) / scale, hats / scale, atol=2e-6)
    np.testing.assert_allclose(np.asarray(out.means) / scale, means / scale, atol=2e-6)
    np.testing.assert_allclose(np.asarray(out.latents), final, atol=1e-4)
    # step i's Gaussian: mean -> next churned state with std sigma_{i+1} sqrt(eta^2 + 2 eta)
    flags = np.asarray(out.stochastic)
    np.testing.assert_array_equal(flags, [True] * (n - 1) + [False])
    for i in range(n - 1):
        std = sig32[i + 1] * math.sqrt(eta**2 + 2 * eta)
        diff = np.asarray(out.trajectory[i + 1], np.float64) - np.asarray(out.means[i], np.float64)
        lp = (-(diff**2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean(axis=(1, 2, 3))
        np.testing.assert_allclose(np.asarray(out.log_probs[i]), lp, rtol=1e-4, atol=1e-4)
    assert not np.asarray(out.log_probs[-1]).any()


# ----------------------------------------------------------------------------- CFG


def _cfg_velocity(calls):
    def velocity(x, timesteps, cond):
        calls.append(x.shape[0])
        scale = cond["w"][:, None, None, None] + cond["pooled"].sum(-1)[:, None, None, None]
        return x * scale + (timesteps / 1000.0)[:, None, None, None]

    return velocity


def test_cfg_one_forward_equals_separate_branches(x_init):
    rng = np.random.default_rng(7)
    cond = {"w": jnp.asarray([0.5, -1.0]), "pooled": jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)}
    uncond = {"w": jnp.asarray([0.2]), "pooled": jnp.zeros((1, 3))}  # one empty prompt, broadcast
    calls = []
    vel = _cfg_velocity(calls)
    t = jnp.full((2,), 800.0)
    g = 4.5
    got = guided_velocity(vel, jnp.asarray(x_init), t, cond, uncond, g)
    assert calls == [4]
    v_c = vel(jnp.asarray(x_init), t, cond)
    v_u = vel(jnp.asarray(x_init), t, jax.tree.map(lambda u: jnp.broadcast_to(u, (2,) + u.shape[1:]), uncond))
    np.testing.assert_allclose(np.asarray(got), np.asarray(v_u + g * (v_c - v_u)), atol=1e-5)
    # guidance 1 (or no uncond) is a single conditional forward
    calls.clear()
    np.testing.assert_allclose(np.asarray(guided_velocity(vel, jnp.asarray(x_init), t, cond, uncond, 1.0)), np.asarray(v_c))
    assert calls == [2]
    with pytest.raises(ValueError, match="uncond"):
        guided_velocity(vel, jnp.asarray(x_init), t, cond, None, 4.5)

    # a whole Euler run with CFG equals a python loop over the guided formula
    sigmas, _ = flow_sigmas(3)
    out = jax.jit(lambda x: sample(vel, x, sigmas, method="euler", cond=cond, uncond=uncond, cfg_scale=g).latents)(x_init)
    x = jnp.asarray(x_init)
    for i in range(3):
        ts = jnp.full((2,), sigmas[i] * np.float32(1000))
        vc, vu = vel(x, ts, cond), vel(x, ts, {"w": jnp.full((2,), 0.2), "pooled": jnp.zeros((2, 3))})
        x = x + (sigmas[i + 1] - sigmas[i]) * (vu + g * (vc - vu))
    np.testing.assert_allclose(np.asarray(out), np.asarray(x), rtol=1e-6, atol=1e-5)


def test_cfg_detached_uncond_has_no_gradient(x_init):
    x = jnp.asarray(x_init)
    t = jnp.full((2,), 500.0)
    vel = _cfg_velocity([])

    def total(cond_w, uncond_w, detach):
        cond = {"w": cond_w, "pooled": jnp.zeros((2, 1))}
        uncond = {"w": uncond_w, "pooled": jnp.zeros((2, 1))}
        return jnp.sum(guided_velocity(vel, x, t, cond, uncond, 4.5, detach_uncond=detach))

    w_c, w_u = jnp.asarray([0.5, 1.0]), jnp.asarray([0.1, 0.2])
    grads = jax.jit(jax.grad(total, argnums=(0, 1)), static_argnums=2)
    gc, gu = grads(w_c, w_u, True)
    assert not np.asarray(gu).any()
    np.testing.assert_allclose(np.asarray(gc), 4.5 * np.asarray(x.sum(axis=(1, 2, 3))), rtol=1e-5)
    _, gu_attached = grads(w_c, w_u, False)
    np.testing.assert_allclose(np.asarray(gu_attached), -3.5 * np.asarray(x.sum(axis=(1, 2, 3))), rtol=1e-5)


def test_cfg_keeps_each_rows_branches_on_its_device():
    """The doubled batch pairs each row's two branches side by side, so on a batch split over
    devices (the model constrains its activations so) the guided forward moves no row: no
    all-to-all or collective-permute in the compiled program. [uncond; cond] put a device's rows
    on others (the Wan GRPO rollout body on v5p:2x2x1: 117 MB all-to-all and 336 MB
    collective-permute, a 96 s libtpu compile against 24 s, docs/recipe_targets.md session 39)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("data",))
    rows = NamedSharding(mesh, P("data"))
    vel = _cfg_velocity([])

    def constrained(x, timesteps, cond):  # as the transformers shard their activations by row
        return vel(jax.lax.with_sharding_constraint(x, rows), timesteps, cond)

    rng = np.random.default_rng(3)
    x = jax.device_put(jnp.asarray(rng.standard_normal((8, 3, 4, 4)), jnp.float32), rows)
    t = jax.device_put(jnp.linspace(100.0, 900.0, 8), rows)
    cond = jax.device_put({"w": jnp.asarray(rng.standard_normal(8), jnp.float32),
                           "pooled": jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)}, rows)
    uncond = {"w": jnp.asarray([0.2]), "pooled": jnp.zeros((1, 3))}
    guided = jax.jit(lambda x, t, c: guided_velocity(constrained, x, t, c, uncond, 4.5),
                     out_shardings=rows)
    hlo = guided.lower(x, t, cond).compile().as_text()
    assert "all-to-all" not in hlo and "collective-permute" not in hlo
    got = np.asarray(guided(x, t, cond))
    v_c = vel(x, t, cond)
    v_u = vel(x, t, {"w": jnp.full((8,), 0.2), "pooled": jnp.zeros((8, 3))})
    np.testing.assert_allclose(got, np.asarray(v_u + 4.5 * (v_c - v_u)), rtol=1e-6, atol=1e-6)


def test_sampler_rejects_bad_arguments(x_init):
    sigmas, _ = flow_sigmas(4)
    with pytest.raises(ValueError, match="unknown sampler method"):
        sample(jax_velocity, x_init, sigmas, method="heun", cond=COND)
    with pytest.raises(ValueError, match="PRNG key"):
        sample(jax_velocity, x_init, sigmas, method="sde", cond=COND)
    with pytest.raises(ValueError, match="sde_window_size"):
        sample(jax_velocity, x_init, sigmas, method="euler", cond=COND, sde_window_size=2)


def test_draw_window_start_covers_the_reference_range():
    from wfm_jax.sampling.samplers import draw_window_start

    starts = {int(draw_window_start(rbg(s), (0, 10), 2)) for s in range(200)}
    assert starts == set(range(9))  # random.randint(0, 10 - 2) is inclusive
    with pytest.raises(ValueError, match="too short"):
        draw_window_start(rbg(0), (0, 2), 3)
