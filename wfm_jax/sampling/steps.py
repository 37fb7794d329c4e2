"""Pure per-step update rules for flow-matching samplers, all in float32 (spec algorithms.md).

Conventions: x_sigma = (1 - sigma) x0 + sigma eps, velocity v = eps - x0, sigma in [0, 1] with 1 =
noise. `sigma`, `sigma_next` are scalars or per-sample (B,) arrays; latents are (B, ...). Each rule
is the same function at rollout and at training time, so the two agree to the bit.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

F32 = jnp.float32
_LOG_SQRT_2PI = math.log(math.sqrt(2.0 * math.pi))


def per_sample(s, x):
    """Cast a scalar or (B,) value to fp32 and shape it to broadcast against x (B, ...)."""
    s = jnp.asarray(s, F32)
    return s.reshape(s.shape + (1,) * (x.ndim - s.ndim)) if s.ndim else s


def mean_over_sample(x):
    """Mean over every axis but the batch axis -> (B,)."""
    return jnp.mean(x, axis=tuple(range(1, x.ndim)))


def gaussian_log_prob(x, mean, std):
    """log N(x; mean, std^2) per element, averaged (not summed) over non-batch dims (spec §2)."""
    std = per_sample(std, x)
    lp = -((x - mean) ** 2) / (2 * std**2) - jnp.log(std) - _LOG_SQRT_2PI
    return mean_over_sample(lp)


# ----------------------------------------------------------------------------- Euler ODE


def euler_step(x, v, sigma, sigma_next):
    """Euler ODE step x + (sigma' - sigma) v, as FlowMatchEulerDiscreteScheduler.step does."""
    dt = per_sample(sigma_next, x) - per_sample(sigma, x)
    return x + dt * v


def x0_from_velocity(x, v, sigma):
    """Clean-sample prediction x - sigma v."""
    return x - per_sample(sigma, x) * v


# ----------------------------------------------------------------------------- Flow-GRPO SDE


def sde_mean(x, v, sigma, sigma_next, noise_level, sigma_for_one):
    """Flow-GRPO reverse-SDE Gaussian (sde_type "sde", spec §2, paper Eq. 8-9).

    Returns (mean, std_dev_t, std): std_dev_t = a sqrt(sigma / (1 - sigma~)) where sigma~ is
    `sigma_for_one` (the schedule's second sigma) when sigma == 1; std = std_dev_t sqrt(-dt) is the
    scale of the step's Gaussian. std_dev_t is what the closed-form KL divides by.
    """
    s = per_sample(sigma, x)
    dt = per_sample(sigma_next, x) - s
    s_tilde = jnp.where(s == 1, jnp.asarray(sigma_for_one, F32), s)
    std_dev_t = jnp.sqrt(s / (1 - s_tilde)) * jnp.asarray(noise_level, F32)
    mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
    return mean, std_dev_t, std_dev_t * jnp.sqrt(-dt)


def sde_step(x, v, sigma, sigma_next, noise, noise_level, sigma_for_one):
    """One stochastic Flow-GRPO step: (x_next, log_prob (B,), mean, std_dev_t)."""
    mean, std_dev_t, std = sde_mean(x, v, sigma, sigma_next, noise_level, sigma_for_one)
    x_next = mean + std * noise
    return x_next, gaussian_log_prob(x_next, mean, std), mean, std_dev_t


def sde_log_prob(x_next, x, v, sigma, sigma_next, noise_level, sigma_for_one):
    """Training-time re-evaluation of a stored SDE step: (log_prob (B,), mean, std_dev_t)."""
    mean, std_dev_t, std = sde_mean(x, v, sigma, sigma_next, noise_level, sigma_for_one)
    return gaussian_log_prob(x_next, mean, std), mean, std_dev_t


# ----------------------------------------------------------------------------- CPS


def _sin_half_pi(noise_level):
    if isinstance(noise_level, (int, float)):
        return math.sin(noise_level * math.pi / 2)  # the reference uses math.sin in float64
    return jnp.sin(jnp.asarray(noise_level, F32) * (math.pi / 2))


def cps_mean(x, v, sigma, sigma_next, noise_level):
    """Coefficient-preserving step (sde_type "cps", spec §2): (mean, std), std = sigma' sin(a pi/2)."""
    s, sn = per_sample(sigma, x), per_sample(sigma_next, x)
    std = sn * _sin_half_pi(noise_level)
    x0_hat = x - s * v
    x1_hat = x + v * (1 - s)
    # Clamp: sigma'^2 - std^2 = sigma'^2 cos^2 >= 0 mathematically; fp32 may round below 0.
    mean = x0_hat * (1 - sn) + x1_hat * jnp.sqrt(jnp.maximum(sn**2 - std**2, 0.0))
    return mean, std


def cps_log_prob(x_next, mean):
    """CPS pseudo log-prob: -mean((x' - mu)^2) per sample, constants and 1/(2 std^2) dropped."""
    return -mean_over_sample((x_next - mean) ** 2)


def cps_step(x, v, sigma, sigma_next, noise, noise_level):
    """One CPS step: (x_next, log_prob (B,), mean, std)."""
    mean, std = cps_mean(x, v, sigma, sigma_next, noise_level)
    x_next = mean + std * noise
    return x_next, cps_log_prob(x_next, mean), mean, std


# ----------------------------------------------------------------------------- DanceGRPO


def dance_mean(x, v, sigma, sigma_next, eta):
    """DanceGRPO `flux_step` Gaussian (spec §2): (mean, std), std = eta sqrt(sigma - sigma')."""
    s, sn = per_sample(sigma, x), per_sample(sigma_next, x)
    dsigma = sn - s
    x0_hat = x - s * v
    score = -(x - x0_hat * (1 - s)) / s**2
    eta = jnp.asarray(eta, F32)
    mean = x + dsigma * v + (-0.5 * eta**2 * score) * dsigma
    return mean, eta * jnp.sqrt(s - sn)


def dance_log_prob(x_next, mean, std):
    """DanceGRPO log-prob as its code computes it: -(x' - mu)^2 / (2 std^2), mean over dims.

    (Its normalising constants sit on a separate statement and never apply; they cancel in ratios.)
    """
    std = per_sample(std, x_next)
    return mean_over_sample(-((x_next - mean) ** 2) / (2 * std**2))


def dance_step(x, v, sigma, sigma_next, noise, eta):
    """One DanceGRPO step: (x_next, log_prob (B,), mean, std)."""
    mean, std = dance_mean(x, v, sigma, sigma_next, eta)
    x_next = mean + per_sample(std, x) * noise
    return x_next, dance_log_prob(x_next, mean, std), mean, std


# ----------------------------------------------------------------------------- DPM-Solver++(2M)


def _lambda(s):
    """Half log-SNR of the flow interpolant, log((1 - s) / s)."""
    return jnp.log(1 - s) - jnp.log(s)


def dpm2_coefficients(sigma_prev, sigma, sigma_next, second_order):
    """Coefficients (a, b, c) of x' = a x + b x0 + c (x0 - x0_prev) for DPM-Solver++ in x0-space.

    First order (DDIM): a = s'/s, b = (1 - s')(1 - e^-h) with e^-h = s'(1-s) / ((1-s')s).
    Second order (2M, midpoint): c = b/2 * h/h0, h = lam' - lam, h0 = lam - lam_prev. When
    sigma_prev == 1, lam_prev = -inf and c = 0, exactly as diffusers and DiffusionNFT get it.
    Written without log(0) so the sigma = 1 first step and sigma' = 0 last step stay finite.
    """
    s, sn = jnp.asarray(sigma, F32), jnp.asarray(sigma_next, F32)
    a = sn / s
    e_mh = sn * (1 - s) / ((1 - sn) * s)
    b = (1 - sn) * (1 - e_mh)
    use2 = jnp.logical_and(second_order, jnp.asarray(sigma_prev) < 1)
    # Safe placeholders keep the unselected branch finite (no inf/nan even in gradients).
    sp = jnp.where(use2, jnp.asarray(sigma_prev, F32), 0.75)
    s2 = jnp.where(use2, s, 0.5)
    sn2 = jnp.where(use2, sn, 0.25)
    ratio = (_lambda(sn2) - _lambda(s2)) / (_lambda(s2) - _lambda(sp))
    c = jnp.where(use2, 0.5 * b * ratio, 0.0)
    return a, b, c


def dpm2_step(x, x0, x0_prev, sigma_prev, sigma, sigma_next, second_order):
    """One DPM-Solver++(2M) step in x0-space (spec §3 data collection, diffusers dpmsolver++)."""
    a, b, c = dpm2_coefficients(sigma_prev, sigma, sigma_next, second_order)
    return a * x + b * x0 + c * (x0 - x0_prev)


# ----------------------------------------------------------------------------- EDM (DDRL)


def edm_churn(x, sigma, noise, eta, s_noise=1.0, s_tmin=0.0, s_tmax=math.inf):
    """EDM Alg. 2 churn: (x_hat, sigma_hat, applied). Raise sigma to (1 + eta) sigma with fresh
    noise of std sqrt(sigma_hat^2 - sigma^2) s_noise when s_tmin < sigma < s_tmax (spec §4)."""
    sigma = jnp.asarray(sigma, F32)
    applied = jnp.logical_and(sigma > s_tmin, sigma < s_tmax)
    sigma_hat = jnp.where(applied, sigma + eta * sigma, sigma)
    x_hat = x + jnp.sqrt(sigma_hat**2 - sigma**2) * s_noise * noise
    return x_hat, sigma_hat, applied


def edm_transition_std(sigma_next, eta, s_noise=1.0):
    """Std of the Gaussian between a step's mean and the next churned state: sigma' sqrt(eta^2+2eta) s_noise."""
    return jnp.asarray(sigma_next, F32) * math.sqrt(eta**2 + 2 * eta) * s_noise


def edm_time(sigma):
    """Rectified-flow time of an EDM sigma: t = sigma / (1 + sigma)."""
    sigma = jnp.asarray(sigma, F32)
    return sigma / (sigma + 1)


def edm_model_input(x, sigma):
    """What the velocity network sees for an EDM state x = x0 + sigma eps: ((1 - t) x, t)."""
    t = edm_time(sigma)
    return per_sample(1 - t, x) * x, t


def edm_x0(x, v, sigma):
    """RF-scaled denoiser x0 = c_skip x + c_out v with c_skip = 1 - t, c_out = -t (cosmos RF scaling)."""
    t = per_sample(edm_time(sigma), x)
    return (1 - t) * x - t * v


def _phi1(z):
    return jnp.expm1(z) / z


def edm_step_mean(x, sigma_hat, sigma_next, x0, x0_prev, sigma_prev_hat, first):
    """Deterministic EDM step from sigma_hat to sigma_next (cosmos `2ab` multistep, spec §4).

    first: x0-form Euler x' = (s'/s) x + (1 - s'/s) x0. Otherwise the 2nd-order Adams-Bashforth
    exponential integrator in -log sigma (`res_x0_rk2_step`) using the previous step's x0 and
    churned sigma.
    """
    s, t = jnp.asarray(sigma_hat, F32), jnp.asarray(sigma_next, F32)
    euler = per_sample((s - t) / s, x) * x0 + per_sample(t / s, x) * x
    sp = jnp.where(first, s * 2.0, jnp.asarray(sigma_prev_hat, F32))  # safe when unused
    ls, lt, lm = -jnp.log(s), -jnp.log(t), -jnp.log(sp)
    dt = lt - ls
    c2 = (lm - ls) / dt
    phi1 = _phi1(-dt)
    phi2 = (phi1 - 1.0) / (-dt)
    b1 = phi1 - phi2 / c2
    b2 = phi2 / c2
    ab2 = per_sample(jnp.exp(-dt), x) * x + per_sample(dt, x) * (
        per_sample(b1, x) * x0 + per_sample(b2, x) * x0_prev
    )
    return jnp.where(first, euler, ab2)
