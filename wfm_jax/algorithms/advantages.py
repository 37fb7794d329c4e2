"""Group-relative advantages on the host, numpy float64 internally (spec algorithms.md §2-§4).

Rewards arrive gathered from all processes as numpy arrays; group keys may be prompt strings or
integer group ids. Results are float32 arrays ready to be put on device.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def _groups(group_keys, n):
    keys = np.asarray(group_keys)
    if keys.shape != (n,):
        raise ValueError(f"group keys have shape {keys.shape}, expected ({n},) to match the rewards")
    _, inverse = np.unique(keys, return_inverse=True)
    return inverse.reshape(-1)


def group_advantages(rewards, group_keys, *, global_std: bool = True, eps: float = 1e-4):
    """Flow-GRPO / DiffusionNFT advantages (`PerPromptStatTracker`, type "grpo"):
    A_i = (R_i - mean_{group(i)} R) / (std + eps), std = population std (numpy default) of ALL
    rewards when global_std, else of the sample's group. rewards: (N,) or (N, K) per-step copies.
    """
    r = np.asarray(rewards, np.float64)
    inv = _groups(group_keys, r.shape[0])
    adv = np.empty_like(r)
    glob = np.std(r, axis=0, keepdims=True) + eps
    for g in np.unique(inv):
        sel = inv == g
        mean = np.mean(r[sel], axis=0, keepdims=True)
        std = glob if global_std else np.std(r[sel], axis=0, keepdims=True) + eps
        adv[sel] = (r[sel] - mean) / std
    return adv.astype(np.float32)


def clip_advantages(adv, clip_max: float = 5.0):
    """Clip to [-clip_max, clip_max] (`adv_clip_max`)."""
    return np.clip(np.asarray(adv), -clip_max, clip_max)


def nft_optimality(adv, adv_clip_max: float = 5.0):
    """DiffusionNFT optimality probability r = clip(clip(A, +-c) / c / 2 + 0.5, 0, 1) in [0, 1] (§3).

    Works on numpy and jax arrays alike (the NFT loss calls it on device).
    """
    xp = np if isinstance(adv, (np.ndarray, np.generic, float, int)) else jnp
    a = xp.clip(adv, -adv_clip_max, adv_clip_max)
    return xp.clip((a / adv_clip_max) / 2.0 + 0.5, 0.0, 1.0)


def ddrl_advantages(rewards, group_keys, *, exp_reward: bool = True, clip_min: float = -5.0, clip_max: float = 5.0, eps: float = 1e-4):
    """DDRL advantages (cosmos-rl wfm trainer, spec §4).

    rewards: (N,) or (M, N) for M reward models. Per model and group (the `num_rollout` replicas
    of one prompt): A = (r - mean) / (unbiased std + eps); a group of one keeps A = r, as the code
    does. Models are averaged, then exp_reward maps A -> -exp(-A), then A is clipped.
    """
    r = np.asarray(rewards, np.float64)
    if r.ndim == 1:
        r = r[None]
    inv = _groups(group_keys, r.shape[1])
    adv = np.empty_like(r)
    for g in np.unique(inv):
        sel = inv == g
        rg = r[:, sel]
        if rg.shape[1] == 1:
            adv[:, sel] = rg
            continue
        mean = rg.mean(axis=1, keepdims=True)
        std = rg.std(axis=1, ddof=1, keepdims=True)
        adv[:, sel] = (rg - mean) / (std + eps)
    a = adv.mean(axis=0)
    if exp_reward:
        a = -np.exp(-a)
    return np.clip(a, clip_min, clip_max).astype(np.float32)
