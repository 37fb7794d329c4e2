"""Samplers as one `lax.scan` over the steps, jit-compatible, model-agnostic (spec algorithms.md).

The model enters as `velocity_fn(x, timesteps, cond) -> v` with timesteps a (B,) float32 array of
sigma * 1000 (never rounded) and `cond` a pytree with a leading batch axis. CFG runs both
branches in one call (see guidance.py).

Methods:
  "euler"  deterministic Euler ODE (diffusers FlowMatchEulerDiscreteScheduler).
  "sde"    Flow-GRPO SDE with per-step Gaussian log-prob (spec §2).
  "cps"    coefficient-preserving sampling with its pseudo log-prob (spec §2).
  "dance"  DanceGRPO flux_step (spec §2).
  "dpm2"   DPM-Solver++(2M) in x0-space, first and last step first order (spec §3).
  "edm"    DDRL rollout: EDM churn + 2nd-order Adams-Bashforth on an EDM sigma grid (spec §4).
  "unipc"  UniPC-bh2 order 2 in flow form (diffusers UniPCMultistepScheduler as Wan runs it;
           unipc.py); give it schedule.unipc_flow_schedule's sigmas and timesteps.
  "dpm_solver"  DPM-Solver++(2M) midpoint in flow form (diffusers DPMSolverMultistepScheduler as
           SANA runs it; dpm_solver.py); give it dpm_solver.dpm_solver_flow_schedule's grid.
For sde/cps/dance, `sde_window_size` turns on the Flow-GRPO-Fast variant: only steps
[sde_window_start, sde_window_start + sde_window_size) are stochastic, the rest are Euler steps.
`sde_window_start` may be a traced integer so the trainer can draw it inside jit.

Trajectory conventions (when return_trajectory=True), N steps:
  trajectory (N+1, B, ...): flow methods: [0] = input latents, [i+1] = state after step i.
      edm: [i] = churned state fed to the network at step i (i < N), [N] = last step's output.
  means (N, B, ...): Gaussian mean of step i, trajectory[i+1] ~ N(means[i], stds[i]^2).
  log_probs (N, B): log-prob of trajectory[i+1] under step i (0 where the step is deterministic).
  noises (N, B, ...): standard normal drawn at step i (flow: produces trajectory[i+1];
      edm: the churn noise that produced trajectory[i]); 0 where unused.
  x0 (N, B, ...): clean prediction at step i; sigmas_hat (N,): sigma the network saw at step i.
  stds (N,): std of step i's Gaussian; stochastic (N,) bool: whether step i is random.
  unipc: trajectory[i+1] is the predictor's output (what the model sees at step i+1, before that
      step's corrector); means = trajectory[1:], log_probs / noises / stds are 0.
  dpm_solver: as unipc, trajectory[i+1] the state after step i.
Latents may have any rank (B, ...): images (B, C, H, W) and video (B, C, T, H, W) alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from wfm_jax.sampling import dpm_solver, unipc
from wfm_jax.sampling import steps as S
from wfm_jax.sampling.guidance import guided_velocity
from wfm_jax.sampling.schedule import edm_churn_eta

F32 = jnp.float32
METHODS = ("euler", "sde", "cps", "dance", "dpm2", "edm", "unipc", "dpm_solver")
DETERMINISTIC = ("euler", "dpm2", "unipc", "dpm_solver")
STOCHASTIC_FLOW = ("sde", "cps", "dance")


class SampleOutput(NamedTuple):
    latents: jax.Array
    stochastic: jax.Array
    trajectory: jax.Array | None = None
    means: jax.Array | None = None
    log_probs: jax.Array | None = None
    noises: jax.Array | None = None
    x0: jax.Array | None = None
    stds: jax.Array | None = None
    sigmas_hat: jax.Array | None = None


def window_mask(num_steps: int, start, size: int | None):
    """(N,) bool: which steps are stochastic; all of them when size is None."""
    idx = jnp.arange(num_steps)
    if size is None:
        return jnp.ones((num_steps,), bool)
    if start is None:
        raise ValueError("sde_window_size is set but sde_window_start is None")
    start = jnp.asarray(start, jnp.int32)
    return jnp.logical_and(idx >= start, idx < start + size)


def draw_window_start(key, window_range, size: int):
    """Flow-GRPO-Fast window start, uniform over [lo, hi - size] inclusive (random.randint in the
    reference), as an int32 scalar usable inside jit."""
    lo, hi = window_range
    if hi - size < lo:
        raise ValueError(f"sde_window_range {tuple(window_range)} is too short for sde_window_size {size}")
    return jax.random.randint(key, (), lo, hi - size + 1, jnp.int32)


def sample(
    velocity_fn: Callable[[jax.Array, jax.Array, Any], jax.Array],
    latents: jax.Array,
    sigmas,
    key: jax.Array | None = None,
    *,
    method: str = "euler",
    cond: Any = None,
    uncond: Any = None,
    cfg_scale: Any = 1.0,
    noise_level: Any = 0.7,
    sde_window_start: Any = None,
    sde_window_size: int | None = None,
    s_churn: float = 1.0,
    s_noise: float = 1.0,
    s_tmin: float = 0.0,
    s_tmax: float = float("inf"),
    timestep_scale: float = 1000.0,
    timesteps: Any = None,
    unipc_solver_type: str = "bh2",
    return_trajectory: bool = False,
    guide: Callable | None = None,
) -> SampleOutput:
    """Run `len(sigmas) - 1` denoising steps from `latents` (fp32) and return a SampleOutput.

    sigmas: flow methods take the flow grid with trailing 0 (schedule.flow_sigmas); "edm" takes
    an EDM grid (schedule.edm_sigmas) and `latents` already at sigma_max (sigma_max * eps).
    noise_level: a for sde/cps, eta for dance. s_churn/s_noise/s_tmin/s_tmax: EDM churn.
    key: PRNG key, required by the stochastic methods.
    timesteps: (N,) what the model sees at step i (flow methods); default sigma_i * timestep_scale
    (never rounded). Wan feeds diffusers' int64-truncated values (schedule.unipc_flow_schedule).
    guide(v_cond, v_uncond, scale): the family's CFG form (guidance.guided_velocity).
    """
    if method not in METHODS:
        raise ValueError(f"unknown sampler method {method!r}; choose one of {METHODS}")
    if method not in DETERMINISTIC and key is None:
        raise ValueError(f"sampler method {method!r} needs a PRNG key")
    if sde_window_size is not None and method not in STOCHASTIC_FLOW:
        raise ValueError(f"sde_window_size only applies to {STOCHASTIC_FLOW}, not {method!r}")
    latents = jnp.asarray(latents, F32)
    sigmas = jnp.asarray(sigmas, F32)
    n = sigmas.shape[0] - 1
    if n < 1:
        raise ValueError(f"need at least 2 sigmas, got {sigmas.shape[0]}")
    xs = {
        "i": jnp.arange(n),
        "sigma": sigmas[:-1],
        "sigma_next": sigmas[1:],
        "sigma_prev": jnp.concatenate([sigmas[:1], sigmas[:-2]]),
    }
    if key is not None:
        xs["key"] = jax.random.split(key, n)
    velocity = _velocity_closure(velocity_fn, cond, uncond, cfg_scale, guide)
    scale = jnp.asarray(timestep_scale, F32)
    if method == "edm":
        if timesteps is not None:
            raise ValueError("timesteps apply to the flow methods, not 'edm'")
        return _sample_edm(lambda x, t: velocity(x, t * scale), latents, sigmas, xs, s_churn,
                           s_noise, s_tmin, s_tmax, return_trajectory)
    xs["t"] = sigmas[:-1] * scale if timesteps is None else jnp.asarray(timesteps, F32)
    if xs["t"].shape != (n,):
        raise ValueError(f"timesteps must have shape ({n},), got {xs['t'].shape}")
    if method == "unipc":
        return _sample_unipc(velocity, latents, sigmas, xs["t"], unipc_solver_type,
                             return_trajectory)
    if method == "dpm_solver":
        return _sample_dpm_solver(velocity, latents, sigmas, xs["t"], return_trajectory)
    stochastic = window_mask(n, sde_window_start, sde_window_size)
    if method not in STOCHASTIC_FLOW:
        stochastic = jnp.zeros((n,), bool)
    xs["stochastic"] = stochastic
    body = _flow_body(method, velocity, noise_level, sigmas[1], n, return_trajectory)
    x0_init = jnp.zeros_like(latents)
    (final, _), rec = jax.lax.scan(body, (latents, x0_init), xs)
    if not return_trajectory:
        return SampleOutput(latents=final, stochastic=stochastic)
    trajectory = jnp.concatenate([latents[None], rec["x_next"]], axis=0)
    return SampleOutput(
        latents=final,
        stochastic=stochastic,
        trajectory=trajectory,
        means=rec["mean"],
        log_probs=rec["log_prob"],
        noises=rec["noise"],
        x0=rec["x0"],
        stds=rec["std"],
        sigmas_hat=sigmas[:-1],
    )


def _velocity_closure(velocity_fn, cond, uncond, cfg_scale, guide=None):
    def velocity(x, t):
        """t: the scalar model timestep of this step, broadcast to the batch."""
        timesteps = jnp.full((x.shape[0],), t, F32)
        return guided_velocity(velocity_fn, x, timesteps, cond, uncond, cfg_scale, guide=guide)

    return velocity


def _sample_unipc(velocity, latents, sigmas, timesteps, solver_type, return_trajectory):
    n = sigmas.shape[0] - 1
    final, rec = unipc.sample_unipc(velocity, latents, sigmas, timesteps,
                                    solver_type=solver_type, return_trajectory=return_trajectory)
    stochastic = jnp.zeros((n,), bool)
    if not return_trajectory:
        return SampleOutput(latents=final, stochastic=stochastic)
    zeros = jnp.zeros_like(rec["x_next"])
    return SampleOutput(latents=final, stochastic=stochastic,
                        trajectory=jnp.concatenate([latents[None], rec["x_next"]], axis=0),
                        means=rec["x_next"], log_probs=jnp.zeros((n, latents.shape[0]), F32),
                        noises=zeros, x0=rec["x0"], stds=jnp.zeros((n,), F32),
                        sigmas_hat=sigmas[:-1])


def _sample_dpm_solver(velocity, latents, sigmas, timesteps, return_trajectory):
    """Recorded like unipc: x_next and x0 per step, no noise, log-probs 0."""
    n = sigmas.shape[0] - 1
    final, rec = dpm_solver.sample_dpm_solver(velocity, latents, sigmas, timesteps,
                                              return_trajectory=return_trajectory)
    stochastic = jnp.zeros((n,), bool)
    if not return_trajectory:
        return SampleOutput(latents=final, stochastic=stochastic)
    return SampleOutput(latents=final, stochastic=stochastic,
                        trajectory=jnp.concatenate([latents[None], rec["x_next"]], axis=0),
                        means=rec["x_next"], log_probs=jnp.zeros((n, latents.shape[0]), F32),
                        noises=jnp.zeros_like(rec["x_next"]), x0=rec["x0"],
                        stds=jnp.zeros((n,), F32), sigmas_hat=sigmas[:-1])


def _flow_body(method, velocity, noise_level, sigma_for_one, n, record):
    def body(carry, step):
        x, x0_prev = carry
        s, sn = step["sigma"], step["sigma_next"]
        v = velocity(x, step["t"])
        x0 = S.x0_from_velocity(x, v, s)
        ode = S.euler_step(x, v, s, sn)
        zero_lp = jnp.zeros((x.shape[0],), F32)
        if method == "dpm2":
            second = jnp.logical_and(step["i"] > 0, step["i"] < n - 1)
            x_next = S.dpm2_step(x, x0, x0_prev, step["sigma_prev"], s, sn, second)
            rec = dict(x_next=x_next, mean=x_next, log_prob=zero_lp, noise=jnp.zeros_like(x), std=jnp.zeros((), F32))
        elif method == "euler":
            rec = dict(x_next=ode, mean=ode, log_prob=zero_lp, noise=jnp.zeros_like(x), std=jnp.zeros((), F32))
        else:
            noise = jax.random.normal(step["key"], x.shape, F32)
            if method == "sde":
                mean, _, std = S.sde_mean(x, v, s, sn, noise_level, sigma_for_one)
                x_s = mean + std * noise
                lp = S.gaussian_log_prob(x_s, mean, std)
            elif method == "cps":
                x_s, lp, mean, std = S.cps_step(x, v, s, sn, noise, noise_level)
            else:
                x_s, lp, mean, std = S.dance_step(x, v, s, sn, noise, noise_level)
            on = step["stochastic"]
            std = jnp.where(on, std, 0.0)
            # Deterministic steps (outside the window, or zero noise) carry log-prob 0, not nan.
            rec = dict(
                x_next=jnp.where(on, x_s, ode),
                mean=jnp.where(on, mean, ode),
                log_prob=jnp.where(jnp.logical_and(on, std > 0), lp, zero_lp),
                noise=jnp.where(on, noise, 0.0),
                std=std.astype(F32),
            )
        rec["x0"] = x0
        return (rec["x_next"], x0), (rec if record else None)

    return body


def _sample_edm(velocity, latents, sigmas, xs, s_churn, s_noise, s_tmin, s_tmax, return_trajectory):
    n = sigmas.shape[0] - 1
    eta = edm_churn_eta(s_churn, n)

    def x0_of(x, sigma):
        x_in, t = S.edm_model_input(x, sigma)
        return S.edm_x0(x, velocity(x_in, t), sigma)

    def body(carry, step):
        x, x0_prev, sigma_prev_hat = carry
        noise = jax.random.normal(step["key"], x.shape, F32)
        x_hat, sigma_hat, applied = S.edm_churn(x, step["sigma"], noise, eta, s_noise, s_tmin, s_tmax)
        x0 = x0_of(x_hat, sigma_hat)
        mean = S.edm_step_mean(x_hat, sigma_hat, step["sigma_next"], x0, x0_prev, sigma_prev_hat, step["i"] == 0)
        rec = dict(applied=applied)
        if return_trajectory:
            rec.update(x_hat=x_hat, mean=mean, noise=jnp.where(applied, noise, 0.0), x0=x0, sigma_hat=sigma_hat)
        return (mean, x0, sigma_hat), rec

    init = (latents, jnp.zeros_like(latents), sigmas[0])
    (x_last, _, _), rec = jax.lax.scan(body, init, xs)
    final = x0_of(x_last, sigmas[-1])  # the extra clean denoise at sigma_min
    # Step i's Gaussian is the churn of step i + 1; the last step has none.
    stochastic = jnp.concatenate([rec["applied"][1:], jnp.zeros((1,), bool)])
    if not return_trajectory:
        return SampleOutput(latents=final, stochastic=stochastic)
    trajectory = jnp.concatenate([rec["x_hat"], x_last[None]], axis=0)
    stds = jnp.where(stochastic, S.edm_transition_std(sigmas[1:], eta, s_noise), 0.0)
    safe = jnp.where(stochastic, stds, 1.0)
    lps = jax.vmap(S.gaussian_log_prob)(trajectory[1:], rec["mean"], safe)
    log_probs = jnp.where(stochastic[:, None], lps, 0.0)
    return SampleOutput(
        latents=final,
        stochastic=stochastic,
        trajectory=trajectory,
        means=rec["mean"],
        log_probs=log_probs,
        noises=rec["noise"],
        x0=rec["x0"],
        stds=stds,
        sigmas_hat=rec["sigma_hat"],
    )
