"""cosmos-rl's world-model rollout sampler: EDM (Karras) grid, churn, x0-form solver steps.

Spec: shared/specs/cosmos_rl_wfm.md §1 and algorithms.md §4 (cosmos-rl `policy/model/wfm/sampler`,
`rollout/wfm_rollout`, the trainer's trajectory cache). The model enters as a denoiser
`x0_fn(x, sigma) -> x0_hat` with x (B, ...) the EDM state x0 + sigma eps and sigma (B,) float32;
`rf_denoiser` builds one from a rectified-flow network the way cosmos's RectifiedFlowScaling does.

Per step k (N = grid intervals), with eta = min(s_churn / (N + 1), sqrt(1.2) - 1):
  churn   sigma_hat_k = (1 + eta) sigma_k when s_t_min < sigma_k < s_t_max, else sigma_k;
          x_hat_k = x_k + sqrt(sigma_hat_k^2 - sigma_k^2) s_noise xi_k
  step    mu_k = deterministic step sigma_hat_k -> sigma_{k+1} from x_hat_k (solver below)
  next    x_{k+1} = mu_k; after the last step one clean denoise: final = x0_fn(x_N, sigma_min).
Solvers (cosmos names): "2ab" (the rollout's: x0-form Euler on the first step, then the
2nd-order Adams-Bashforth exponential integrator in -log sigma using the previous step's x0 and
sigma_hat), "1euler", "2heun_edm" (EDM's Heun correction: Euler, re-denoise at sigma_{k+1},
Euler again with the mean of both x0). A solver of order 2 gets sample_steps // 2 intervals,
as cosmos's sampler builds its grid.

Deviations from cosmos-rl on purpose (its §10 defects): the rollout uses the configured solver
(cosmos always rolls out with "2ab"), and rollout and training share one float32 step function,
so the importance ratio is exactly 1 at the rollout weights (cosmos rolls out in float64).

Randomness (part of the contract; tests rebuild it): initial unit noise from `initial_noise`;
the churn noise of step k is `jax.random.normal(jax.random.fold_in(key, k), x.shape)`, never
shared between group members even when the initial noise is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
Denoiser = Callable[[jax.Array, jax.Array], jax.Array]
SOLVER_ORDER = {"2ab": 1, "1euler": 1, "2heun_edm": 2}


def _check_solver(solver: str) -> None:
    if solver not in SOLVER_ORDER:
        raise ValueError(f"unknown EDM solver {solver!r}; choose one of {tuple(SOLVER_ORDER)}")


# ----------------------------------------------------------------------------- host-side plan


def sigma_grid(num_intervals: int, sigma_min: float = 0.01, sigma_max: float = 200.0,
               rho: float = 7.0) -> np.ndarray:
    """Karras grid sigma_i = (sigma_max^(1/rho) + i/N (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho,
    i = 0..N, float64 (N + 1,), from sigma_max down to sigma_min (cosmos `get_rev_ts`)."""
    if num_intervals < 1:
        raise ValueError(f"the EDM grid needs at least 1 interval, got {num_intervals}")
    if not 0 < sigma_min < sigma_max:
        raise ValueError(f"the EDM grid needs 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}")
    if rho <= 0:
        raise ValueError(f"the EDM grid needs rho > 0, got {rho}")
    i = np.arange(num_intervals + 1, dtype=np.float64)
    hi, lo = sigma_max ** (1.0 / rho), sigma_min ** (1.0 / rho)
    return (hi + i / num_intervals * (lo - hi)) ** rho


def churn_eta(s_churn: float, num_intervals: int) -> float:
    """EDM Alg. 2 churn factor min(s_churn / (N + 1), sqrt(1.2) - 1)."""
    return min(s_churn / (num_intervals + 1), math.sqrt(1.2) - 1.0)


@dataclass(frozen=True, eq=False)  # hashed by identity: usable as a static jit argument
class EDMPlan:
    """Everything about a rollout that does not depend on the data, computed on the host in
    float64 (as cosmos computes its sigmas) and handed to the device as float32."""

    solver: str
    sigmas: np.ndarray      # (N + 1,) the grid, sigma_max .. sigma_min
    sigma_hat: np.ndarray   # (N,) churned sigma each step's network call sees
    churn_std: np.ndarray   # (N,) sqrt(sigma_hat^2 - sigma^2) s_noise; 0 where no churn
    eta: float

    @property
    def num_intervals(self) -> int:
        return int(self.sigma_hat.shape[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[-1])

    def transition_std(self) -> np.ndarray:
        """(N,) std of the next churned state x_hat_{k+1} around step k's mean mu_k: the churn
        std of step k + 1 (= sigma_{k+1} sqrt(eta^2 + 2 eta) s_noise), 0 for the last step and
        where step k + 1 has no churn. The loss deliberately does not divide by it: a metric."""
        return np.append(self.churn_std[1:], 0.0)


def make_plan(sample_steps: int, *, solver: str = "2ab", sigma_min: float = 0.01,
              sigma_max: float = 200.0, rho: float = 7.0, s_churn: float = 1.0,
              s_noise: float = 1.0, s_t_min: float = 0.0, s_t_max: float = math.inf) -> EDMPlan:
    """The rollout's grid and churn (defaults: cosmos-rl's RL sampler, model.sde and model.rl)."""
    _check_solver(solver)
    n = int(sample_steps) // SOLVER_ORDER[solver]
    if n < 1:
        raise ValueError(f"sample_steps={sample_steps} gives no interval for solver {solver!r}")
    if s_churn < 0 or s_noise < 0:
        raise ValueError(f"s_churn and s_noise must be >= 0, got {s_churn}, {s_noise}")
    sigmas = sigma_grid(n, sigma_min, sigma_max, rho)
    eta = churn_eta(s_churn, n)
    sig = sigmas[:-1]
    applied = (sig > s_t_min) & (sig < s_t_max)
    sigma_hat = np.where(applied, sig + eta * sig, sig)
    churn_std = np.sqrt(sigma_hat**2 - sig**2) * s_noise
    return EDMPlan(solver, sigmas, sigma_hat, churn_std, eta)


# ----------------------------------------------------------------------------- step math


def _col(s, x):
    """A scalar or (B,) value as float32 shaped to broadcast against x (B, ...)."""
    s = jnp.asarray(s, F32)
    return s.reshape(s.shape + (1,) * (x.ndim - s.ndim)) if s.ndim else s


def _rows(s, x):
    """A scalar or (B,) sigma as the (B,) float32 array a denoiser receives."""
    return jnp.broadcast_to(jnp.asarray(s, F32), (x.shape[0],))


def rf_denoiser(net: Callable[[jax.Array, jax.Array], jax.Array],
                timestep_scale: float = 1.0) -> Denoiser:
    """x0_fn of a rectified-flow network F(x_in, timestep) under cosmos's RectifiedFlowScaling
    (sigma_data 1): t = sigma / (1 + sigma), x_in = (1 - t) x, timestep = t * timestep_scale
    (cosmos feeds t itself, `rectified_flow_t_scaling_factor` 1), x0 = (1 - t) x - t F."""
    def x0_fn(x, sigma):
        t = jnp.asarray(sigma, F32) / (jnp.asarray(sigma, F32) + 1.0)
        tc = _col(t, x)
        return (1.0 - tc) * x - tc * net((1.0 - tc) * x, _rows(t * timestep_scale, x))
    return x0_fn


def cosmos_guided(cond_fn: Denoiser, uncond_fn: Denoiser | None, guidance: float) -> Denoiser:
    """cosmos-rl's guidance x0 = c + g (c - u) (standard CFG at scale g + 1). guidance 0, the RL
    default, is one conditional pass (uncond_fn may then be None). As in cosmos (v2v
    `get_x0_fn_from_batch`) the gradient flows through both branches."""
    if guidance == 0:
        return cond_fn
    if uncond_fn is None:
        raise ValueError(f"guidance {guidance} needs an unconditional denoiser")

    def x0_fn(x, sigma):
        c = cond_fn(x, sigma)
        return c + guidance * (c - uncond_fn(x, sigma))
    return x0_fn


def churn(x, sigma_hat, sigma, noise, s_noise: float = 1.0):
    """x + sqrt(sigma_hat^2 - sigma^2) s_noise noise (sigmas scalar or (B,))."""
    std = jnp.sqrt(jnp.maximum(_col(sigma_hat, x) ** 2 - _col(sigma, x) ** 2, 0.0))
    return x + std * jnp.asarray(s_noise, F32) * noise


def euler_x0_step(x, sigma, sigma_next, x0):
    """x0-form Euler sigma -> sigma': (sigma - sigma')/sigma x0 + sigma'/sigma x."""
    s, t = _col(sigma, x), _col(sigma_next, x)
    return (s - t) / s * x0 + t / s * x


def ab2_x0_step(x, sigma, sigma_next, x0, sigma_prev, x0_prev):
    """2nd-order Adams-Bashforth exponential integrator in lambda = -log sigma (cosmos
    `res_x0_rk2_step`): h = lambda' - lambda, c2 = (lambda_prev - lambda) / h,
    x' = e^-h x + h (b1 x0 + b2 x0_prev), b1 = phi1(-h) - phi2(-h)/c2, b2 = phi2(-h)/c2,
    phi1(z) = (e^z - 1)/z, phi2(z) = (phi1(z) - 1)/z."""
    lam, lam_next, lam_prev = (-jnp.log(jnp.asarray(v, F32)) for v in (sigma, sigma_next, sigma_prev))
    h = lam_next - lam
    c2 = (lam_prev - lam) / h
    phi1 = jnp.expm1(-h) / (-h)
    phi2 = (phi1 - 1.0) / (-h)
    b2 = phi2 / c2
    b1 = phi1 - b2
    return _col(jnp.exp(-h), x) * x + _col(h, x) * (_col(b1, x) * x0 + _col(b2, x) * x0_prev)


def step_mean(x0_fn: Denoiser, x_hat, sigma_hat, sigma_next, *, solver: str = "2ab",
              x0_prev=None, sigma_prev=None, first=True):
    """(mu, x0) of one deterministic step sigma_hat -> sigma_next from the churned state x_hat
    (cosmos `get_mu_from_model`): the same function at rollout and at training time.

    "2ab" uses the previous step's x0 and sigma_hat (x0_prev, sigma_prev) unless `first` (a bool,
    possibly traced or per row); x0 is this step's prediction. "2heun_edm" returns the averaged
    x0 as cosmos does. Sigmas are scalars or (B,) per row.
    """
    _check_solver(solver)
    x0 = x0_fn(x_hat, _rows(sigma_hat, x_hat))
    if solver == "2heun_edm":
        x_pred = euler_x0_step(x_hat, sigma_hat, sigma_next, x0)
        x0 = 0.5 * (x0 + x0_fn(x_pred, _rows(sigma_next, x_hat)))
    euler = euler_x0_step(x_hat, sigma_hat, sigma_next, x0)
    if solver != "2ab" or (isinstance(first, bool) and first):
        return euler, x0
    if x0_prev is None or sigma_prev is None:
        raise ValueError("the 2ab step after the first needs x0_prev and sigma_prev")
    first = jnp.asarray(first, bool)
    # Where `first` holds the history is a placeholder: give it a finite sigma so the unused
    # branch (and its gradient) stays finite.
    safe_prev = jnp.where(first, 2.0 * jnp.asarray(sigma_hat, F32), jnp.asarray(sigma_prev, F32))
    ab2 = ab2_x0_step(x_hat, sigma_hat, sigma_next, x0, safe_prev, x0_prev)
    return jnp.where(_col(first, x_hat), euler, ab2), x0


# ----------------------------------------------------------------------------- noise


def contiguous_group_ids(batch: int, group_size: int) -> np.ndarray:
    """(B,) group id of each row when each group's `group_size` members are adjacent rows."""
    if group_size < 1 or batch % group_size:
        raise ValueError(f"a batch of {batch} rows does not split into groups of {group_size}")
    return np.arange(batch) // group_size


def initial_noise(key, shape, group_ids=None):
    """Unit Gaussian initial noise eps, float32 `shape` = (B, ...); the rollout starts at
    sigma_max eps. group_ids (B,) ints: every row of a group gets the same eps, drawn from
    fold_in(key, group id), so a row's noise does not depend on where the group sits in the
    batch or on which process holds it (cosmos `use_same_seed`). None: independent rows."""
    shape = tuple(int(s) for s in shape)
    if group_ids is None:
        return jax.random.normal(key, shape, F32)
    ids = jnp.asarray(group_ids, jnp.int32)
    if ids.shape != shape[:1]:
        raise ValueError(f"group_ids has shape {ids.shape}, expected ({shape[0]},) for noise {shape}")
    return jax.vmap(lambda g: jax.random.normal(jax.random.fold_in(key, g), shape[1:], F32))(ids)


# ----------------------------------------------------------------------------- the rollout


class EDMTrajectory(NamedTuple):
    """A recorded rollout, N = plan.num_intervals steps (cosmos's per-step cache, float32).

    noise (B, ...): initial unit noise eps (the data loss's epsilon). x_hat (N, B, ...): churned
    state each step's network saw (cosmos `noise_x`). x0 (N, B, ...): each step's x0 prediction.
    mu (N, B, ...): each step's deterministic output (`mu_old`). final (B, ...): the clean
    sample. sigma_hat / sigma_next (N,): float32 sigmas of each step.
    """

    noise: jax.Array
    x_hat: jax.Array
    x0: jax.Array
    mu: jax.Array
    final: jax.Array
    sigma_hat: jax.Array
    sigma_next: jax.Array


class TrajectoryStep(NamedTuple):
    """What the RL step needs of trained step k (cosmos's cached record plus the 2ab history).
    `sample` is the next churned state x_hat_{k+1}, or the final clean sample at k = N - 1."""

    noise_x: jax.Array
    sigma: jax.Array
    sigma_next: jax.Array
    x0_pred: jax.Array
    mu_old: jax.Array
    sample: jax.Array
    x0_prev: jax.Array
    sigma_prev: jax.Array
    first: jax.Array
    index: jax.Array


def sample(x0_fn: Denoiser, noise, plan: EDMPlan, key, *, record: bool = True):
    """Roll out from sigma_max * noise (noise float32 (B, ...)) as one lax.scan; jit-safe with
    `plan` static. Returns an EDMTrajectory (record=True) or only the final clean sample."""
    noise = jnp.asarray(noise, F32)
    n = plan.num_intervals
    xs = {"k": jnp.arange(n), "sigma": jnp.asarray(plan.sigmas[:-1], F32),
          "sigma_hat": jnp.asarray(plan.sigma_hat, F32),
          "sigma_next": jnp.asarray(plan.sigmas[1:], F32),
          "churn_std": jnp.asarray(plan.churn_std, F32)}

    def body(carry, step):
        x, x0_prev, sigma_prev = carry
        xi = jax.random.normal(jax.random.fold_in(key, step["k"]), x.shape, F32)
        x_hat = x + step["churn_std"] * xi
        mu, x0 = step_mean(x0_fn, x_hat, step["sigma_hat"], step["sigma_next"], solver=plan.solver,
                           x0_prev=x0_prev, sigma_prev=sigma_prev, first=step["k"] == 0)
        out = {"x_hat": x_hat, "x0": x0, "mu": mu} if record else {}
        return (mu, x0, step["sigma_hat"]), out

    x_init = noise * jnp.asarray(plan.sigma_max, F32)
    (x_last, _, _), rec = jax.lax.scan(body, (x_init, jnp.zeros_like(noise), xs["sigma_hat"][0]), xs)
    final = x0_fn(x_last, _rows(plan.sigma_min, x_last))
    if not record:
        return final
    return EDMTrajectory(noise, rec["x_hat"], rec["x0"], rec["mu"], final, xs["sigma_hat"],
                         xs["sigma_next"])


def trajectory_step(traj: EDMTrajectory, k) -> TrajectoryStep:
    """Trained step k (python or traced int) of a trajectory, as the RL step consumes it."""
    n = traj.x_hat.shape[0]
    k = jnp.asarray(k, jnp.int32)
    prev = jnp.maximum(k - 1, 0)
    nxt = jnp.minimum(k + 1, n - 1)
    sample_next = jnp.where(k == n - 1, traj.final, traj.x_hat[nxt])
    return TrajectoryStep(noise_x=traj.x_hat[k], sigma=traj.sigma_hat[k],
                          sigma_next=traj.sigma_next[k], x0_pred=traj.x0[k], mu_old=traj.mu[k],
                          sample=sample_next, x0_prev=traj.x0[prev], sigma_prev=traj.sigma_hat[prev],
                          first=k == 0, index=k)
