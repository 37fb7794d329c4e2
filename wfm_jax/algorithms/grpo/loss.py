"""Flow-GRPO objective: PPO-clipped likelihood ratio plus closed-form Gaussian KL to the reference
(spec algorithms.md §2; flow_grpo train_sd3.py). Per trained denoising step j:

  ratio = exp(logp_theta - logp_old)
  L_pol = mean_B max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps)),  A clipped to [lo, hi]
  L_KL  = mean_B [ mean_CHW (mu_theta - mu_ref)^2 / (2 std_dev_t^2) ]   (no dt, as the code does)
  L = L_pol + kl_beta L_KL
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wfm_jax.sampling.steps import mean_over_sample

F32 = jnp.float32


def closed_form_kl(mean, ref_mean, std_dev_t):
    """Per-sample KL surrogate mean_CHW (mu - mu_ref)^2 / (2 std_dev_t^2), (B,). std_dev_t: scalar,
    (B,) or broadcastable to mean (sde_mean returns it shaped for broadcasting)."""
    sq = (mean.astype(F32) - jax.lax.stop_gradient(ref_mean.astype(F32))) ** 2
    std = jnp.asarray(std_dev_t, F32)
    if std.ndim == 1:
        std = std.reshape(std.shape + (1,) * (sq.ndim - 1))
    return mean_over_sample(sq / (2 * std**2))


def weighted_mean(x, weight=None):
    """Mean over the batch; with weight (B,) in {0, 1}, the mean over the weighted rows (0 when
    none is): flow_grpo's zero-advantage filter without changing the batch shape."""
    if weight is None:
        return jnp.mean(x)
    w = jnp.asarray(weight, F32)
    return jnp.sum(w * x) / jnp.maximum(jnp.sum(w), 1.0)


def ppo_clipped_loss(log_prob, old_log_prob, advantages, clip_range: float = 1e-4,
                     adv_clip_max: float = 5.0, adv_clip_min: float | None = None, weight=None):
    """(policy_loss, ratio (B,)) of the PPO-clipped surrogate; old_log_prob is a constant.
    Advantages are clipped to [adv_clip_min (None: -adv_clip_max), adv_clip_max]."""
    lo = -adv_clip_max if adv_clip_min is None else adv_clip_min
    adv = jnp.clip(jnp.asarray(advantages, F32), lo, adv_clip_max)
    ratio = jnp.exp(log_prob.astype(F32) - jax.lax.stop_gradient(jnp.asarray(old_log_prob, F32)))
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return weighted_mean(jnp.maximum(unclipped, clipped), weight), ratio


def grpo_loss(log_prob, old_log_prob, advantages, *, clip_range: float = 1e-4, adv_clip_max: float = 5.0,
              adv_clip_min: float | None = None, kl_beta: float = 0.0, mean=None, ref_mean=None,
              std_dev_t=None, weight=None):
    """Flow-GRPO loss for one trained step. The KL term needs mean, ref_mean and std_dev_t (the
    values `steps.sde_log_prob` returns) and is skipped when kl_beta == 0. weight (B,) in {0, 1}
    (optional) restricts both terms to the weighted rows (the zero-advantage filter).

    Returns (loss, metrics): policy_loss, kl_loss, approx_kl = mean 0.5 (logp - logp_old)^2,
    clipfrac = mean(|ratio - 1| > clip_range), ratio_mean, loss.
    """
    policy_loss, ratio = ppo_clipped_loss(log_prob, old_log_prob, advantages, clip_range,
                                          adv_clip_max, adv_clip_min, weight)
    if kl_beta:
        if mean is None or ref_mean is None or std_dev_t is None:
            raise ValueError("kl_beta > 0 needs mean, ref_mean and std_dev_t")
        kl = weighted_mean(closed_form_kl(mean, ref_mean, std_dev_t), weight)
    else:
        kl = jnp.zeros((), F32)
    loss = policy_loss + kl_beta * kl
    log_ratio = log_prob.astype(F32) - jnp.asarray(old_log_prob, F32)
    metrics = {
        "policy_loss": policy_loss,
        "kl_loss": kl,
        "approx_kl": 0.5 * jnp.mean(log_ratio**2),
        "clipfrac": jnp.mean((jnp.abs(ratio - 1.0) > clip_range).astype(F32)),
        "ratio_mean": jnp.mean(ratio),
        "loss": loss,
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)
