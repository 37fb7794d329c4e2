"""UniPC (Wan's scheduler) against diffusers, and every sampler on 5-D video latents.

UniPC: the lax.scan sampler and diffusers' UniPCMultistepScheduler (flow sigmas, order 2, bh2 as
Wan's pipeline configures it; bh1 too) are driven by the same velocity function, fed the same
int64-truncated timesteps; latents after N steps must agree to 1e-5. The velocity is the exact
flow velocity of Gaussian data plus a tanh term (not linear in x, and time-dependent).

5-D: each method run on (B, C, T, H, W) latents must give exactly what it gives on the same
numbers folded to 4-D (B, C, T*H, W) with the same key: nothing may broadcast over a wrong axis
or assume rank 4 (rbg keys draw the same numbers for both shapes).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import UniPCMultistepScheduler

from wfm_jax.sampling import unipc
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import edm_sigmas, flow_sigmas, unipc_flow_schedule

VIDEO = (2, 3, 3, 4, 4)  # (B, C, T, H, W)
M = np.array([0.7, -0.4], np.float32)
S2 = 0.25


def _v(x, sigma, m, tanh):
    """Gaussian-data flow velocity plus 0.1 tanh(x); numpy / torch / jax alike."""
    var = (1 - sigma) ** 2 * S2 + sigma**2
    r = x - (1 - sigma) * m
    return sigma * r / var - (m + (1 - sigma) * S2 * r / var) + 0.1 * tanh(x)


def jax_velocity(x, timesteps, cond):
    shape = (-1,) + (1,) * (x.ndim - 1)
    return _v(x, (timesteps / 1000.0).reshape(shape), cond["m"].reshape(shape), jnp.tanh)


COND = {"m": jnp.asarray(M)}


@pytest.fixture(scope="module")
def x_video():
    return np.random.default_rng(0).standard_normal(VIDEO).astype(np.float32)


def _diffusers_unipc(x, n, shift, solver_type):
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=shift,
                                    solver_type=solver_type)
    sched.set_timesteps(n)
    xs = [torch.from_numpy(x)]
    m = torch.from_numpy(M).reshape(-1, 1, 1, 1, 1)
    for t in sched.timesteps:
        xs.append(sched.step(_v(xs[-1], t.float() / 1000.0, m, torch.tanh), t, xs[-1]).prev_sample)
    return sched, np.stack([x.numpy() for x in xs])


@pytest.mark.parametrize("n, shift, solver_type", [(1, 3.0, "bh2"), (2, 3.0, "bh2"),
                                                   (3, 3.0, "bh2"), (8, 3.0, "bh2"),
                                                   (20, 5.0, "bh2"), (8, 1.0, "bh2"),
                                                   (8, 3.0, "bh1")])
def test_unipc_matches_diffusers(x_video, n, shift, solver_type):
    sched, traj = _diffusers_unipc(x_video, n, shift, solver_type)
    sigmas, timesteps = unipc_flow_schedule(n, shift)
    np.testing.assert_array_equal(sigmas, sched.sigmas.numpy())
    np.testing.assert_array_equal(timesteps, sched.timesteps.numpy().astype(np.float32))
    out = jax.jit(lambda x: sample(jax_velocity, x, sigmas, method="unipc", cond=COND,
                                   timesteps=timesteps, unipc_solver_type=solver_type,
                                   return_trajectory=True))(x_video)
    got = np.asarray(out.trajectory)
    if solver_type == "bh1":
        # diffusers' bh1 last step to sigma 0 computes (-inf) * 0 and returns NaN; ours returns
        # the x0 prediction (what bh2 returns). Compare every step before it.
        assert np.isnan(traj[-1]).all()
        got, traj = got[:-1], traj[:-1]
    err = float(np.max(np.abs(got - traj)))
    print(f"unipc n={n} shift={shift} {solver_type}: max abs err {err:.3g} (all steps)")
    assert err <= 1e-5
    np.testing.assert_array_equal(np.asarray(out.trajectory[-1]), np.asarray(out.latents))
    # the last step lands on its x0 prediction exactly (sigma 0)
    np.testing.assert_array_equal(np.asarray(out.latents), np.asarray(out.x0[-1]))


def test_unipc_orders_warm_up_and_fall_back():
    assert unipc.step_orders(1) == ([1], [0])
    assert unipc.step_orders(4) == ([1, 2, 2, 1], [0, 1, 2, 2])
    assert unipc.step_orders(4, order=1) == ([1, 1, 1, 1], [0, 1, 1, 1])


def test_unipc_bad_arguments(x_video):
    sigmas, timesteps = unipc_flow_schedule(4)
    with pytest.raises(ValueError, match="solver_type"):
        sample(jax_velocity, x_video, sigmas, method="unipc", cond=COND,
               unipc_solver_type="bh3")
    with pytest.raises(ValueError, match="timesteps must have shape"):
        sample(jax_velocity, x_video, sigmas, method="unipc", cond=COND, timesteps=timesteps[:2])
    with pytest.raises(ValueError, match="num_steps"):
        unipc_flow_schedule(0)


def _run(method, x, **kw):
    if method == "edm":
        sigmas = edm_sigmas(5)
        x = x * np.float32(sigmas[0])
    elif method == "unipc":
        sigmas, kw["timesteps"] = unipc_flow_schedule(5)
    else:
        sigmas, _ = flow_sigmas(5)
    key = None if method in ("euler", "dpm2", "unipc") else jax.random.key(7, impl="rbg")
    uncond = {"m": jnp.zeros((1,), jnp.float32)}
    return jax.jit(lambda x: sample(jax_velocity, x, sigmas, key, method=method, cond=COND,
                                    uncond=uncond, cfg_scale=2.5, return_trajectory=True,
                                    **kw))(x)


@pytest.mark.parametrize("method, kw", [("euler", {}), ("sde", {}), ("cps", {}), ("dance", {}),
                                        ("dpm2", {}), ("edm", {}), ("unipc", {}),
                                        ("sde", dict(sde_window_start=1, sde_window_size=2))],
                         ids=["euler", "sde", "cps", "dance", "dpm2", "edm", "unipc", "sde_fast"])
def test_sampler_on_5d_video_latents_equals_folded_4d(x_video, method, kw):
    b, c, t, h, w = VIDEO
    video = _run(method, x_video, **kw)
    folded = _run(method, x_video.reshape(b, c, t * h, w), **kw)
    assert video.latents.shape == VIDEO and np.all(np.isfinite(np.asarray(video.latents)))
    # the same elementwise maths on another shape: XLA:CPU's fusions may contract a multiply-add
    # differently per shape (2 ulp apart on CI's AVX2 host, bit-equal on AVX-512 ones)
    for name in ("latents", "trajectory", "means", "x0", "noises"):
        got, want = np.asarray(getattr(video, name)), np.asarray(getattr(folded, name))
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6,
                                   err_msg=name)
    # a mean over a differently shaped axis set sums in another order: fp32 rounding only
    np.testing.assert_allclose(np.asarray(video.log_probs), np.asarray(folded.log_probs),
                               rtol=1e-6, atol=1e-6)
    assert video.log_probs.shape == (5, b)
    if method in ("sde", "cps", "dance", "edm"):  # the noise really entered
        assert np.asarray(video.stochastic).any() and np.abs(np.asarray(video.noises)).max() > 0
