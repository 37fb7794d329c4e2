"""DDRL loss (spec algorithms.md §4; cosmos-rl wfm trainer `rl_training_step`). Per trained step k:

  log_ratio = -[(x_{k+1} - mu_theta)^2 - (x_{k+1} - mu_old)^2]  (deliberately no 1/(2 std^2))
              / std_k  (only with log_ratio_norm "std"; not cosmos-rl's)
  ratio = exp(mean_{C,T,H,W} log_ratio)
  L_pol = mean max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps))
  L_KL = mean (mu_ref - mu_theta)^2                     (only when kl_beta > 0)
  L_data = mean[(sigma^2 + sd^2)/(sigma sd)^2 (x0 - x0_hat)^2]  at x_sigma = x0 + sigma eps
  L = (L_pol + kl_beta L_KL + data_beta L_data) * loss_scale
Advantages come from advantages.ddrl_advantages (exp-mapped there, clipped once by the RL loop).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wfm_jax.sampling.steps import mean_over_sample, per_sample

F32 = jnp.float32
LOG_RATIO_NORMS = ("none", "std")  # train.train_policy.log_ratio_norm (config/schema.py CHOICES)


def unscaled_log_ratio(x_next, mean_theta, mean_old):
    """Per-sample mean of -[(x' - mu_theta)^2 - (x' - mu_old)^2], (B,)."""
    x_next = x_next.astype(F32)
    mean_old = jax.lax.stop_gradient(mean_old.astype(F32))
    return mean_over_sample(-((x_next - mean_theta.astype(F32)) ** 2 - (x_next - mean_old) ** 2))


def step_log_ratio(x_next, mean_theta, mean_old, std=None):
    """The per-sample log-ratio (B,), divided by the step's transition std (B,) when given.

    Unscaled, its gradient is 2 (x' - mu) dmu/dtheta with x' - mu of the step's noise std, so the
    noisiest trained step outweighs the others (on the tiny EDM grid, sigma_max 200, the first
    step's factor std (1 - sigma'/sigma_hat) t is about 3x the third's and 100x the seventh's;
    docs/shapes_world.md). Dividing by std gives every step a gradient of like scale. A std of 0
    (the last step, no churn after it) is taken as 1: that step's x' equals mu_old."""
    log_ratio = unscaled_log_ratio(x_next, mean_theta, mean_old)
    if std is None:
        return log_ratio
    std = jnp.asarray(std, F32)
    return log_ratio / jnp.where(std > 0, std, 1.0)


def ddrl_policy_loss(x_next, mean_theta, mean_old, advantages, clip_ratio: float = 1e-4, std=None):
    """(policy_loss, ratio (B,), log_ratio (B,)); std: see step_log_ratio."""
    log_ratio = step_log_ratio(x_next, mean_theta, mean_old, std)
    ratio = jnp.exp(log_ratio)
    adv = jnp.asarray(advantages, F32)
    unclipped = -adv * ratio
    clipped = -jnp.clip(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv
    return jnp.mean(jnp.maximum(unclipped, clipped)), ratio, log_ratio


def edm_loss_weight(sigma, sigma_data: float = 1.0):
    """(sigma^2 + sigma_data^2) / (sigma sigma_data)^2 (EDM per-sigma weight)."""
    sigma = jnp.asarray(sigma, F32)
    return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2


def edm_noisy(x0, eps, sigma):
    """EDM forward process x_sigma = x0 + sigma eps (marginal_prob mean x0, std sigma)."""
    return x0 + per_sample(sigma, x0) * eps


def ddrl_data_loss(x0, x0_pred, sigma, sigma_data: float = 1.0):
    """EDM-form x0 loss mean[w(sigma) (x0 - x0_hat)^2] over all elements (x0_hat from the RF
    denoiser, steps.edm_x0). Equals ((1-t)^2 + t^2) ||v_hat - (eps - x0)||^2 in RF terms."""
    w = per_sample(edm_loss_weight(sigma, sigma_data), x0)
    return jnp.mean(w * (x0.astype(F32) - x0_pred.astype(F32)) ** 2)


def draw_data_sigma(key, batch_size: int, p_mean: float, p_std: float):
    """sigma ~ lognormal(p_mean, p_std) for the data loss when use_rl_sigma_and_noise is off."""
    return jnp.exp(p_mean + p_std * jax.random.normal(key, (batch_size,), F32))


def ddrl_loss(x_next, mean_theta, mean_old, advantages, *, clip_ratio: float = 1e-4, kl_beta: float = 0.0,
              mean_ref=None, data_beta: float = 0.0, data_loss=None, loss_scale: float = 10.0,
              std=None):
    """Total DDRL loss for one trained step. data_loss: the value of `ddrl_data_loss` (or None when
    this step has none, e.g. data_on_first_only); std: the step's transition std (B,) under
    log_ratio_norm "std", else None. Returns (loss, metrics)."""
    policy_loss, ratio, log_ratio = ddrl_policy_loss(x_next, mean_theta, mean_old, advantages,
                                                     clip_ratio, std)
    if kl_beta:
        if mean_ref is None:
            raise ValueError("kl_beta > 0 needs mean_ref")
        kl = jnp.mean((jax.lax.stop_gradient(mean_ref.astype(F32)) - mean_theta.astype(F32)) ** 2)
    else:
        kl = jnp.zeros((), F32)
    data = jnp.zeros((), F32) if data_loss is None else data_loss
    total = policy_loss + kl_beta * kl + data_beta * data
    loss = total * loss_scale
    metrics = {
        "policy_loss": policy_loss,
        "kl_loss": kl,
        "data_loss": data,
        "log_prob_ratio": jnp.mean(log_ratio),
        "ratio_mean": jnp.mean(ratio),
        "clipfrac": jnp.mean((jnp.abs(ratio - 1.0) > clip_ratio).astype(F32)),
        "ratio_abs_dev": jnp.max(jnp.abs(ratio - 1.0)),  # 0 exactly on the first inner epoch
        "loss": loss,
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)
