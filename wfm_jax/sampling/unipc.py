"""UniPC multistep sampler in flow-matching form: diffusers' `UniPCMultistepScheduler` with
`prediction_type="flow_prediction"`, `use_flow_sigmas=True`, predict_x0, `lower_order_final`,
solver order 2 and B(h) "bh2" (or "bh1") — the scheduler Wan's pipeline runs (spec
video_models.md §2.7).

Each step i evaluates the model once at x_i and converts it to x0 = x_i - sigma_i v. The UniC
corrector then refines x_i with that x0 (from step 1 on), and the UniP predictor steps the
corrected x_i to x_{i+1}. Orders warm up (1 on the first step) and fall back to 1 on the last
step, as diffusers' counters do; the coefficients are the same fp32 scalar formulas, computed
inside the scan so traced sigmas work. The last step to sigma 0 returns x0 exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from wfm_jax.sampling import steps as S

F32 = jnp.float32
SOLVER_TYPES = ("bh1", "bh2")


def _lam(s):
    """Half log-SNR of the flow interpolant, log((1 - s) / s)."""
    return jnp.log(1 - s) - jnp.log(s)


def _phis(h, solver_type):
    """(h phi_1, B(h), b_1, b_2) of UniPC for step size h in lambda (predict_x0: hh = -h)."""
    hh = -h
    h_phi_1 = jnp.expm1(hh)
    b_h = h_phi_1 if solver_type == "bh2" else hh
    k1 = h_phi_1 / hh - 1
    return h_phi_1, b_h, k1 / b_h, (k1 / hh - 0.5) * 2 / b_h


def predictor(x, m0, m1, sigma_prev, sigma, sigma_next, order, solver_type="bh2"):
    """UniP: step x (at sigma, x0 prediction m0; m1 from sigma_prev) to sigma_next.
    order 1 or 2 (may be traced). sigma_next = 0 gives m0 exactly."""
    s0, sp = jnp.asarray(sigma, F32), jnp.asarray(sigma_prev, F32)
    last = jnp.asarray(sigma_next, F32) == 0
    st = jnp.where(last, 0.5 * s0, jnp.asarray(sigma_next, F32))  # finite stand-in, unused
    h = _lam(st) - _lam(s0)
    h_phi_1, b_h, _, _ = _phis(h, solver_type)
    alpha_t = 1 - st
    x_t = (st / s0) * x - (alpha_t * h_phi_1) * m0
    rk = (_lam(sp) - _lam(s0)) / h
    second = jnp.logical_and(order == 2, jnp.logical_not(last))
    d1 = (m1 - m0) / jnp.where(second, rk, 1.0)
    x_t = jnp.where(second, x_t - (alpha_t * b_h) * (0.5 * d1), x_t)
    return jnp.where(last, m0, x_t)


def corrector(x, m0, m1, m_t, sigma_prev, sigma, sigma_t, order, solver_type="bh2"):
    """UniC: correct the predictor's result at sigma_t given the model's x0 there (m_t); x is the
    previous (corrected) sample at sigma with x0 prediction m0, m1 the one at sigma_prev."""
    s0, st, sp = (jnp.asarray(s, F32) for s in (sigma, sigma_t, sigma_prev))
    h = _lam(st) - _lam(s0)
    h_phi_1, b_h, b1, b2 = _phis(h, solver_type)
    alpha_t = 1 - st
    x_t = (st / s0) * x - (alpha_t * h_phi_1) * m0
    d1_t = m_t - m0
    second = order == 2
    rk = jnp.where(second, (_lam(sp) - _lam(s0)) / h, 0.5)
    # R rho = b with R = [[1, 1], [rk, 1]] (rho_c = 0.5 at order 1)
    rho0 = (b1 - b2) / (1 - rk)
    rho1 = jnp.where(second, b1 - rho0, 0.5)
    corr = jnp.where(second, rho0 * ((m1 - m0) / rk), 0.0)
    return x_t - (alpha_t * b_h) * (corr + rho1 * d1_t)


def step_orders(num_steps: int, order: int = 2):
    """(predictor order of each step, corrector order of each step (0 = no corrector))."""
    p = [min(order, num_steps - i, i + 1) for i in range(num_steps)]
    return p, [0] + p[:-1]


def sample_unipc(velocity, latents, sigmas, timesteps, *, order=2, solver_type="bh2",
                 return_trajectory=False):
    """velocity(x, t) -> v at model timesteps t; sigmas (N+1,) ending at 0 (flow grid);
    timesteps (N,) what the model sees at each step. Returns (final, record or None); the
    record holds x_next (the predictor's output, what the model sees next) and x0 per step."""
    if order not in (1, 2):
        raise ValueError(f"UniPC order must be 1 or 2, got {order}")
    if solver_type not in SOLVER_TYPES:
        raise ValueError(f"UniPC solver_type must be one of {SOLVER_TYPES}, got {solver_type!r}")
    n = sigmas.shape[0] - 1
    p_order, c_order = step_orders(n, order)
    pad = jnp.full((2,), 0.5, F32)  # sigmas before the first step: placeholders, never used
    padded = jnp.concatenate([pad, sigmas])
    xs = dict(sigma_prev2=padded[:n], sigma_prev=padded[1:n + 1], sigma=sigmas[:-1],
              sigma_next=sigmas[1:], t=timesteps, p=jnp.asarray(p_order),
              c=jnp.asarray(c_order))

    def body(carry, step):
        x, last, m1, m2 = carry
        m = S.x0_from_velocity(x, velocity(x, step["t"]), step["sigma"])
        fixed = corrector(last, m1, m2, m, step["sigma_prev2"], step["sigma_prev"],
                          step["sigma"], step["c"], solver_type)
        x = jnp.where(step["c"] > 0, fixed, x)
        x_next = predictor(x, m, m1, step["sigma_prev"], step["sigma"], step["sigma_next"],
                           step["p"], solver_type)
        return (x_next, x, m, m1), (dict(x_next=x_next, x0=m) if return_trajectory else None)

    zeros = jnp.zeros_like(latents)
    (final, _, _, _), rec = jax.lax.scan(body, (latents, latents, zeros, zeros), xs)
    return final, rec
