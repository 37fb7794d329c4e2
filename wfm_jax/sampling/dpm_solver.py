"""DPM-Solver++ multistep sampler in flow-matching form: diffusers' `DPMSolverMultistepScheduler`
with `algorithm_type="dpmsolver++"`, `prediction_type="flow_prediction"`, `use_flow_sigmas=True`,
`flow_shift`, `final_sigmas_type="zero"` and `lower_order_final` — the scheduler SANA and
SANA-Video run (spec video_models.md §1.3, §1.4, §2.7).

Each step evaluates the model once at x_i, converts it to x0 = x_i - sigma_i v and steps x_i to
x_{i+1} with alpha = 1 - sigma, lambda = log(alpha) - log(sigma). Order 2 ("2M") uses the previous
step's x0 as well; the first step is first order (no history) and so is the last one (diffusers
always drops to first order on the final step to sigma 0, which returns x0 exactly). The formulas
are diffusers' fp32 scalar expressions, evaluated inside the scan so traced sigmas work.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.sampling import steps as S

F32 = jnp.float32
SOLVER_TYPES = ("midpoint", "heun")


def dpm_solver_flow_schedule(num_steps: int, shift: float = 3.0,
                             num_train_timesteps: int = 1000):
    """`DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=shift).set_timesteps(n)`.

    Returns (sigmas, timesteps): sigmas float32 (n + 1,) ending with 0 (the first is
    shift(1 - 1/T) / (1 + (shift - 1)(1 - 1/T)), never 1); timesteps float32 (n,) holding
    diffusers' int64 `scheduler.timesteps` (float64 T sigma truncated), what SANA's DiT is fed.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    alphas = np.linspace(1, 1 / num_train_timesteps, num_steps + 1)
    s = 1.0 - alphas
    s = np.flip(shift * s / (1 + (shift - 1) * s))[:-1].copy()
    timesteps = (s * num_train_timesteps).astype(np.int64).astype(np.float32)
    return np.concatenate([s, [0.0]]).astype(np.float32), timesteps


def step_orders(num_steps: int, order: int = 2) -> list[int]:
    """Solver order of each step: 1 on the first (no history) and on the last (to sigma 0)."""
    return [1 if i == 0 or i == num_steps - 1 else order for i in range(num_steps)]


def _lam(alpha, sigma):
    """Half log-SNR log(alpha) - log(sigma), as diffusers writes it."""
    return jnp.log(alpha) - jnp.log(sigma)


def update(x, m0, m1, sigma_prev, sigma, sigma_next, order, solver_type="midpoint"):
    """Step x (at sigma, x0 prediction m0; m1 the one at sigma_prev) to sigma_next.

    order 1 or 2 (may be traced). sigma_next = 0 returns m0; sigma_prev = 1 (lambda = -inf) makes
    the second-order term vanish, as it does in diffusers, without an inf in this graph.
    """
    s0, sp = jnp.asarray(sigma, F32), jnp.asarray(sigma_prev, F32)
    last = jnp.asarray(sigma_next, F32) == 0
    st = jnp.where(last, 0.5 * s0, jnp.asarray(sigma_next, F32))  # finite stand-in, unused
    alpha_t = 1 - st
    h = _lam(alpha_t, st) - _lam(1 - s0, s0)
    phi = alpha_t * (jnp.exp(-h) - 1.0)
    x_t = (st / s0) * x - phi * m0
    second = jnp.logical_and(jnp.logical_and(order == 2, jnp.logical_not(last)), sp < 1)
    sp_safe = jnp.where(second, sp, 0.5)
    h_0 = _lam(1 - s0, s0) - _lam(1 - sp_safe, sp_safe)
    d1 = (1.0 / jnp.where(second, h_0 / h, 1.0)) * (m0 - m1)
    if solver_type == "midpoint":
        correction = -0.5 * phi * d1
    else:  # heun
        correction = (alpha_t * ((jnp.exp(-h) - 1.0) / h + 1.0)) * d1
    x_t = jnp.where(second, x_t + correction, x_t)
    return jnp.where(last, m0, x_t)


def sample_dpm_solver(velocity, latents, sigmas, timesteps, *, order=2, solver_type="midpoint",
                      return_trajectory=False):
    """velocity(x, t) -> v at model timestep t; sigmas (N+1,) ending at 0 (flow grid); timesteps
    (N,) what the model sees at each step. Returns (final, record or None); the record holds
    x_next (the state after each step) and x0 (each step's clean prediction)."""
    if order not in (1, 2):
        raise ValueError(f"DPM-Solver++ order must be 1 or 2, got {order}")
    if solver_type not in SOLVER_TYPES:
        raise ValueError(f"DPM-Solver++ solver_type must be one of {SOLVER_TYPES}, "
                         f"got {solver_type!r}")
    n = sigmas.shape[0] - 1
    pad = jnp.full((1,), 0.5, F32)  # sigma before the first step: a placeholder, never used
    xs = dict(sigma_prev=jnp.concatenate([pad, sigmas[:n - 1]]), sigma=sigmas[:-1],
              sigma_next=sigmas[1:], t=timesteps, order=jnp.asarray(step_orders(n, order)))

    def body(carry, step):
        x, m1 = carry
        m = S.x0_from_velocity(x, velocity(x, step["t"]), step["sigma"])
        x_next = update(x, m, m1, step["sigma_prev"], step["sigma"], step["sigma_next"],
                        step["order"], solver_type)
        return (x_next, m), (dict(x_next=x_next, x0=m) if return_trajectory else None)

    (final, _), rec = jax.lax.scan(body, (latents, jnp.zeros_like(latents)), xs)
    return final, rec
