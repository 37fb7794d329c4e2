"""Flow DPM-Solver++ (SANA's scheduler) against diffusers' DPMSolverMultistepScheduler.

Both sides are driven by the same fixed random linear "model", v = A x (channel mixing) +
(t / 1000) b, computed in torch for diffusers and in jax for ours from identical fp32 numbers, fed
the same int64-truncated timesteps. Every state of the trajectory must agree to 1e-5 on 4-D image
and 5-D video latents, for several step counts and shifts (1 step: first order only; 2: first
order twice; more: 2M in between).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from wfm_jax.sampling import dpm_solver
from wfm_jax.sampling.samplers import sample

C = 3
RNG = np.random.default_rng(0)
A = (RNG.standard_normal((C, C)) * 0.4 - np.eye(C) * 0.8).astype(np.float32)
BIAS = RNG.standard_normal(C).astype(np.float32)
SHAPES = {"image": (2, C, 4, 5), "video": (2, C, 3, 4, 4)}


def _expand(vec, ndim):
    return vec.reshape((1, -1) + (1,) * (ndim - 2))


def torch_velocity(x, t):
    mixed = torch.einsum("oc,bc...->bo...", torch.from_numpy(A), x)
    return mixed + (t.float() / 1000.0) * _expand(torch.from_numpy(BIAS), x.ndim)


def jax_velocity(x, timesteps, cond):
    mixed = jnp.einsum("oc,bc...->bo...", jnp.asarray(A), x)
    t = timesteps.reshape((-1,) + (1,) * (x.ndim - 1))
    return mixed + (t / 1000.0) * _expand(jnp.asarray(BIAS), x.ndim)


def _diffusers(x, n, shift, **kw):
    sched = DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2,
                                        prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=shift, final_sigmas_type="zero",
                                        lower_order_final=True, **kw)
    sched.set_timesteps(n)
    xs = [torch.from_numpy(x)]
    for t in sched.timesteps:
        xs.append(sched.step(torch_velocity(xs[-1], t), t, xs[-1]).prev_sample)
    return sched, np.stack([x.numpy() for x in xs])


@pytest.mark.parametrize("kind", ["image", "video"])
@pytest.mark.parametrize("n, shift", [(1, 3.0), (2, 3.0), (3, 3.0), (10, 3.0), (20, 8.0),
                                      (16, 1.0)])
def test_trajectory_matches_diffusers(kind, n, shift):
    x = np.random.default_rng(n).standard_normal(SHAPES[kind]).astype(np.float32)
    sched, want = _diffusers(x, n, shift)
    sigmas, timesteps = dpm_solver.dpm_solver_flow_schedule(n, shift)
    np.testing.assert_array_equal(sigmas, sched.sigmas.numpy())
    np.testing.assert_array_equal(timesteps, sched.timesteps.numpy().astype(np.float32))
    out = jax.jit(lambda x: sample(jax_velocity, x, sigmas, method="dpm_solver",
                                   timesteps=timesteps, return_trajectory=True))(x)
    got = np.asarray(out.trajectory)
    assert got.shape == want.shape and np.abs(want[-1] - want[0]).max() > 0.1
    err = float(np.max(np.abs(got - want)))
    print(f"dpm_solver {kind} n={n} shift={shift}: max abs err {err:.3g} (all steps)")
    assert err <= 1e-5
    # the last step to sigma 0 lands on its x0 prediction exactly
    np.testing.assert_array_equal(np.asarray(out.latents), np.asarray(out.x0[-1]))
    np.testing.assert_array_equal(np.asarray(out.trajectory[-1]), np.asarray(out.latents))


def test_heun_matches_diffusers():
    x = np.random.default_rng(1).standard_normal(SHAPES["image"]).astype(np.float32)
    _, want = _diffusers(x, 6, 3.0, solver_type="heun")
    sigmas, timesteps = dpm_solver.dpm_solver_flow_schedule(6, 3.0)
    vel = lambda x, t: jax_velocity(x, jnp.full((x.shape[0],), t), None)
    final, rec = jax.jit(lambda x: dpm_solver.sample_dpm_solver(
        vel, x, jnp.asarray(sigmas), jnp.asarray(timesteps), solver_type="heun",
        return_trajectory=True))(x)
    np.testing.assert_allclose(np.asarray(rec["x_next"]), want[1:], rtol=0, atol=1e-5)


def test_sigma_one_start_drops_the_second_order_term_without_nan():
    # a grid starting at sigma 1 (the SD3 grid): lambda = -inf there, so step 1's 2M term is 0 in
    # diffusers; ours must give the same finite numbers and finite gradients
    sigmas = np.array([1.0, 0.7, 0.4, 0.0], np.float32)
    x = np.random.default_rng(2).standard_normal(SHAPES["image"]).astype(np.float32)
    sched, _ = _diffusers(x, 3, 3.0)
    sched.set_timesteps(3)
    sched.sigmas = torch.from_numpy(sigmas)
    want = torch.from_numpy(x)
    for t in sched.timesteps:
        want = sched.step(torch_velocity(want, t), t, want).prev_sample
    timesteps = sched.timesteps.numpy().astype(np.float32)
    run = lambda x: sample(jax_velocity, x, sigmas, method="dpm_solver",
                           timesteps=timesteps).latents
    np.testing.assert_allclose(np.asarray(jax.jit(run)(x)), want.numpy(), rtol=0, atol=1e-5)
    grad = jax.grad(lambda x: jnp.sum(run(x) ** 2))(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(grad)))


def test_step_orders():
    assert dpm_solver.step_orders(1) == [1]
    assert dpm_solver.step_orders(2) == [1, 1]
    assert dpm_solver.step_orders(4) == [1, 2, 2, 1]
    assert dpm_solver.step_orders(4, order=1) == [1, 1, 1, 1]


def test_bad_arguments():
    sigmas, timesteps = dpm_solver.dpm_solver_flow_schedule(4)
    x = jnp.zeros(SHAPES["image"])
    vel = lambda x, t: x
    with pytest.raises(ValueError, match="solver_type"):
        dpm_solver.sample_dpm_solver(vel, x, jnp.asarray(sigmas), jnp.asarray(timesteps),
                                     solver_type="bh2")
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        dpm_solver.sample_dpm_solver(vel, x, jnp.asarray(sigmas), jnp.asarray(timesteps),
                                     order=3)
    with pytest.raises(ValueError, match="timesteps must have shape"):
        sample(jax_velocity, x, sigmas, method="dpm_solver", timesteps=timesteps[:2])
    with pytest.raises(ValueError, match="num_steps"):
        dpm_solver.dpm_solver_flow_schedule(0)
