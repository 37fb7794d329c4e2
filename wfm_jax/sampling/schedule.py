"""Noise schedules: the shifted flow-matching grid as diffusers builds it, the SFT training table,
and the EDM sigma grid used by DDRL (spec algorithms.md §0, §1, §4).

All functions run on the host in numpy and return plain arrays; samplers move them to device.
The flow-matching values are bit-identical to diffusers' `FlowMatchEulerDiscreteScheduler`
(default config: no dynamic shifting, no Karras/exponential/beta sigmas, no terminal shift).
"""

from __future__ import annotations

import math

import numpy as np


def _init_sigmas(shift: float, num_train_timesteps: int) -> np.ndarray:
    """The scheduler's constructor grid: fp32 ops in diffusers' order (it uses fp32 torch math)."""
    ts = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1].copy()
    sigmas = ts / np.float32(num_train_timesteps)
    shift32 = np.float32(shift)
    return (shift32 * sigmas) / (np.float32(1.0) + np.float32(shift - 1.0) * sigmas)


def flow_sigmas(num_steps: int, shift: float = 3.0, num_train_timesteps: int = 1000):
    """Inference schedule of `FlowMatchEulerDiscreteScheduler.set_timesteps(num_steps)`.

    Returns (sigmas, timesteps): sigmas float32 (num_steps + 1,) ending with 0, timesteps float32
    (num_steps,) = sigmas[:-1] * num_train_timesteps (fp32 product, what the transformer sees).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    base = _init_sigmas(shift, num_train_timesteps)
    # diffusers reads sigma_max/min back as python floats and continues in float64.
    sigma_max, sigma_min = float(base[0]), float(base[-1])
    t = np.linspace(sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_steps)
    s = t / num_train_timesteps
    s = (shift * s / (1 + (shift - 1) * s)).astype(np.float32)
    timesteps = s * np.float32(num_train_timesteps)
    sigmas = np.concatenate([s, np.zeros(1, np.float32)])
    return sigmas, timesteps


def training_table(shift: float = 3.0, num_train_timesteps: int = 1000):
    """The untouched scheduler's (timesteps, sigmas) tables, float32 (num_train_timesteps,) each.

    SD3 training indexes these with floor(u * num_train_timesteps) (spec §1); index 0 is sigma 1.
    """
    sigmas = _init_sigmas(shift, num_train_timesteps)
    return sigmas * np.float32(num_train_timesteps), sigmas


def edm_sigmas(num_steps: int, sigma_min: float = 0.01, sigma_max: float = 200.0, rho: float = 7.0):
    """EDM/Karras grid from sigma_max down to sigma_min, float64 (num_steps + 1,) (spec §4).

    sigma_i = (sigma_max^(1/rho) + i/N (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho; no trailing 0:
    the sampler finishes with one extra denoise at sigma_min.
    """
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"need 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    i = np.arange(num_steps + 1, dtype=np.float64)
    lo, hi = sigma_min ** (1.0 / rho), sigma_max ** (1.0 / rho)
    return (hi + i / num_steps * (lo - hi)) ** rho


def edm_churn_eta(s_churn: float, num_steps: int) -> float:
    """EDM Alg. 2 churn factor eta = min(s_churn / (N + 1), sqrt(1.2) - 1) (spec §4)."""
    return min(s_churn / (num_steps + 1), math.sqrt(1.2) - 1.0)


def unipc_flow_schedule(num_steps: int, shift: float = 3.0, num_train_timesteps: int = 1000):
    """`UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=shift).set_timesteps(num_steps)`
    (Wan's scheduler; default final_sigmas_type "zero", no dynamic shifting).

    Returns (sigmas, timesteps): sigmas float32 (num_steps + 1,) ending with 0, the first nudged
    to 1 - 1e-6 as diffusers does; timesteps float32 (num_steps,) holding diffusers' int64
    `scheduler.timesteps` (float64 1000 sigma truncated), which is what the Wan DiT is fed.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = np.linspace(1, 1 / num_train_timesteps, num_steps + 1)[:-1]
    s = shift * s / (1 + (shift - 1) * s)
    if abs(s[0] - 1) < 1e-6:
        s[0] -= 1e-6
    timesteps = (s * num_train_timesteps).astype(np.int64).astype(np.float32)
    return np.concatenate([s, [0.0]]).astype(np.float32), timesteps


def default_flow_schedule(num_steps: int, shift: float, solver: str):
    """(sigmas (N+1,), timesteps (N,) or None = 1000 sigma) a flow sampler of sampling.samplers
    steps on with the flow-matching schedulers' defaults at `shift`: UniPC's grid (and its
    truncated timesteps) for "unipc", DPMSolverMultistepScheduler's for "dpm_solver",
    FlowMatchEulerDiscreteScheduler's for every other."""
    if solver == "unipc":
        return unipc_flow_schedule(num_steps, shift)
    if solver == "dpm_solver":
        from wfm_jax.sampling.dpm_solver import dpm_solver_flow_schedule
        return dpm_solver_flow_schedule(num_steps, shift)
    return flow_sigmas(num_steps, shift)[0], None


def flow_schedule_of(source, num_steps: int, solver: str = "euler"):
    """The (sigmas, timesteps) of `solver`: from a model family's `flow_schedule` (its own noise
    range), or, for a bare flow shift (toy models), the defaults at that shift."""
    if hasattr(source, "flow_schedule"):
        return source.flow_schedule(num_steps, solver)
    return default_flow_schedule(num_steps, float(source), solver)
