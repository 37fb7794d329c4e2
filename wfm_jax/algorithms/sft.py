"""Rectified-flow SFT loss with SD3-style timestep sampling and weighting (spec algorithms.md §1).

Timesteps: u from `sample_density` (diffusers `compute_density_for_timestep_sampling`), index =
floor(u * 1000) into the shifted training table (schedule.training_table), as diffusers' SD3
training script does; the transformer gets the table's float timestep, the noise mix its sigma.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from wfm_jax.sampling.steps import mean_over_sample, per_sample

F32 = jnp.float32
DENSITY_SCHEMES = ("logit_normal", "mode", "uniform")
# diffusers drives density and weighting with one string; these names mean "uniform" for density.
_UNIFORM_ALIASES = ("none", "sigma_sqrt", "cosmap")
WEIGHTING_SCHEMES = ("none", "sigma_sqrt", "cosmap", "logit_normal", "mode", "uniform")


def sample_density(key, batch_size: int, scheme: str = "logit_normal", logit_mean=0.0, logit_std=1.0,
                   mode_scale=1.29):
    """u in [0, 1) per sample, float32 (B,): logit_normal u = sigmoid(N(m, s)); mode
    u = 1 - U - mode_scale (cos^2(pi U / 2) - 1 + U); uniform u = U."""
    if scheme == "logit_normal":
        return jax.nn.sigmoid(logit_mean + logit_std * jax.random.normal(key, (batch_size,), F32))
    if scheme == "mode":
        u = jax.random.uniform(key, (batch_size,), F32)
        return 1 - u - mode_scale * (jnp.cos(math.pi * u / 2) ** 2 - 1 + u)
    if scheme in ("uniform",) + _UNIFORM_ALIASES:
        return jax.random.uniform(key, (batch_size,), F32)
    raise ValueError(f"unknown timestep density scheme {scheme!r}; choose one of {DENSITY_SCHEMES}")


def table_indices(u, num_train_timesteps: int = 1000):
    """floor(u * T) as int32, clipped into [0, T-1] (u == 1.0 from an fp32 sigmoid would overflow)."""
    idx = jnp.floor(jnp.asarray(u, F32) * num_train_timesteps).astype(jnp.int32)
    return jnp.clip(idx, 0, num_train_timesteps - 1)


def sample_training_timesteps(key, batch_size, table_timesteps, table_sigmas, scheme="logit_normal",
                              **density_kwargs):
    """Draw (indices, timesteps, sigmas) for a batch from the shifted training table."""
    table_timesteps = jnp.asarray(table_timesteps, F32)
    idx = table_indices(sample_density(key, batch_size, scheme, **density_kwargs), table_timesteps.shape[0])
    return idx, table_timesteps[idx], jnp.asarray(table_sigmas, F32)[idx]


def loss_weighting(scheme: str, sigmas):
    """diffusers `compute_loss_weighting_for_sd3`: sigma_sqrt -> sigma^-2, cosmap ->
    2 / (pi (1 - 2 sigma + 2 sigma^2)), anything else -> 1. Float32 (B,)."""
    sigmas = jnp.asarray(sigmas, F32)
    if scheme == "sigma_sqrt":
        return sigmas**-2.0
    if scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas + 2 * sigmas**2))
    if scheme in WEIGHTING_SCHEMES:
        return jnp.ones_like(sigmas)
    raise ValueError(f"unknown loss weighting scheme {scheme!r}; choose one of {WEIGHTING_SCHEMES}")


def noisy_latents(x0, noise, sigmas):
    """Forward process x_sigma = (1 - sigma) x0 + sigma eps."""
    s = per_sample(sigmas, x0)
    return (1.0 - s) * x0 + s * noise


def flow_matching_loss(v_pred, noise, x0, sigmas, weighting: str = "none", sample_weight=None):
    """E[w(sigma) ||v_pred - (eps - x0)||^2]: per-sample mean over C,H,W(,T), then batch mean.

    sample_weight (B,) multiplies each sample's loss (Flow-GRPO's online rejection fine-tuning uses
    the 0/1 advantage here). Computed in float32 whatever the network's dtype.
    """
    target = noise.astype(F32) - x0.astype(F32)
    w = per_sample(loss_weighting(weighting, sigmas), target)
    per = mean_over_sample(w * (v_pred.astype(F32) - target) ** 2)
    if sample_weight is not None:
        per = per * jnp.asarray(sample_weight, F32)
    return jnp.mean(per)
