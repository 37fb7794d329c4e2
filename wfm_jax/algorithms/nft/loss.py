"""DiffusionNFT forward-process loss (spec algorithms.md §3; NVlabs train_nft_sd3.py).

For a stored clean sample x0, fresh eps and x_t = (1 - t) x0 + t eps:
  v+ = beta v_theta + (1 - beta) sg(v_old)         (implicit positive policy)
  v- = (1 + beta) sg(v_old) - beta v_theta         (implicit negative policy)
  x0+- = x_t - t v+-;  w+- = sg(mean_CHW |x0+- - x0|) clipped >= 1e-5
  L+- = mean_CHW (x0+- - x0)^2 / w+-
  r = clip(clip(A, +-c)/c/2 + 0.5, 0, 1)  with c = adv_clip_max
  policy = mean_B[ c (r L+ + (1 - r) L-) / beta ];  kl = mean_B mean_CHW (v_theta - v_ref)^2
  loss = policy + kl_weight * kl
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.advantages import nft_optimality
from wfm_jax.sampling.steps import mean_over_sample, per_sample

F32 = jnp.float32
WEIGHT_FLOOR = 1e-5


def _adaptive_x0_loss(x0_pred, x0):
    err = x0_pred - x0
    w = jax.lax.stop_gradient(jnp.maximum(mean_over_sample(jnp.abs(err)), WEIGHT_FLOOR))
    return mean_over_sample(err**2) / w


def nft_loss(v_theta, v_old, x0, x_t, t, advantages, v_ref=None, *, beta: float = 1.0, adv_clip_max: float =
             5.0, adv_clip_min: float | None = None, kl_weight: float = 1e-4):
    """NFT loss and metrics. t: (B,) = timestep / 1000; advantages: (B,) raw (clipped here).

    v_old and v_ref are treated as constants (stop_gradient). v_ref None -> no KL term.
    Returns (loss, metrics) with policy_loss, kl_loss, unweighted_policy_loss, old_deviation
    (mean (v_theta - v_old)^2, the reference's "old_deviate"), old_deviation_max, x0_norm,
    x0_norm_max, old_kl_div.
    """
    v_theta = v_theta.astype(F32)
    v_old = jax.lax.stop_gradient(v_old.astype(F32))
    x0 = x0.astype(F32)
    x_t = x_t.astype(F32)
    tt = per_sample(t, x0)
    r = nft_optimality(jnp.asarray(advantages, F32), adv_clip_max, adv_clip_min)
    v_pos = beta * v_theta + (1 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    loss_pos = _adaptive_x0_loss(x_t - tt * v_pos, x0)
    loss_neg = _adaptive_x0_loss(x_t - tt * v_neg, x0)
    per_sample_policy = r * loss_pos / beta + (1.0 - r) * loss_neg / beta
    policy_loss = jnp.mean(per_sample_policy * adv_clip_max)
    dev = jax.lax.stop_gradient((v_theta - v_old) ** 2)
    metrics = {
        "policy_loss": policy_loss,
        "unweighted_policy_loss": jnp.mean(per_sample_policy),
        "old_deviation": jnp.mean(dev),
        "old_deviation_max": jnp.max(dev),
        "x0_norm": jnp.mean(x0**2),
        "x0_norm_max": jnp.max(x0**2),
    }
    if v_ref is None:
        kl = jnp.zeros((), F32)
    else:
        v_ref = jax.lax.stop_gradient(v_ref.astype(F32))
        kl = jnp.mean(mean_over_sample((v_theta - v_ref) ** 2))
        metrics["old_kl_div"] = jnp.mean(mean_over_sample((v_old - v_ref) ** 2))
    loss = policy_loss + kl_weight * kl
    metrics["kl_loss"] = kl
    metrics["loss"] = loss
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def trained_step_count(num_steps: int, fraction: float) -> int:
    """Number of trained timesteps per sample: int(num_steps * timesteps_fraction) (9 of 10)."""
    return int(num_steps * fraction)


def train_timesteps(key, timesteps, batch_size: int, num_train: int):
    """(B, num_train) timesteps: an independent random permutation of the rollout's timesteps per
    sample, first num_train kept (spec §3)."""
    timesteps = jnp.asarray(timesteps, F32)
    keys = jax.random.split(key, batch_size)
    perms = jax.vmap(lambda k: jax.random.permutation(k, timesteps.shape[0]))(keys)
    return timesteps[perms[:, :num_train]]
