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


def group_advantages(rewards, group_keys, *, global_std: bool = True, ddof: int = 0,
                     eps: float = 1e-4):
    """Group-relative advantages A_i = (R_i - mean_{group(i)} R) / (std + eps).

    global_std=True, ddof=0: NVlabs DiffusionNFT / flow_grpo (`PerPromptStatTracker`): the
    population std of ALL rewards. global_std=False, ddof=1: cosmos-rl's remote-reward path
    (torch's unbiased std of the sample's group); a group too small for its std (size <= ddof)
    gets A = 0, as cosmos-rl zeroes its NaN advantages. rewards: (N,) or (N, K) per-step copies.
    """
    r = np.asarray(rewards, np.float64)
    inv = _groups(group_keys, r.shape[0])
    adv = np.zeros_like(r)
    glob = np.std(r, axis=0, ddof=ddof, keepdims=True) + eps if r.shape[0] > ddof else None
    for g in np.unique(inv):
        sel = inv == g
        if global_std:
            std = glob
        else:
            std = np.std(r[sel], axis=0, ddof=ddof, keepdims=True) + eps if sel.sum() > ddof else None
        if std is not None:
            adv[sel] = (r[sel] - np.mean(r[sel], axis=0, keepdims=True)) / std
    return adv.astype(np.float32)


def zero_std_ratio(rewards, group_keys) -> float:
    """Fraction of groups whose rewards are all equal (flow_grpo's `zero_std_ratio`): those
    groups carry no learning signal."""
    r = np.asarray(rewards, np.float64).reshape(len(rewards), -1)[:, 0]
    inv = _groups(group_keys, r.shape[0])
    groups = np.unique(inv)
    return float(np.mean([np.std(r[inv == g]) == 0 for g in groups])) if groups.size else 0.0


def clip_advantages(adv, clip_max: float = 5.0, clip_min: float | None = None):
    """Clip to [clip_min, clip_max] (cosmos-rl advantage_low / advantage_high; flow_grpo
    adv_clip_max is the symmetric case, clip_min None -> -clip_max)."""
    return np.clip(np.asarray(adv), -clip_max if clip_min is None else clip_min, clip_max)


def nft_optimality(adv, adv_clip_max: float = 5.0, adv_clip_min: float | None = None):
    """DiffusionNFT optimality probability r = clip(clip(A, lo, c) / c / 2 + 0.5, 0, 1) in [0, 1]
    (§3), c = adv_clip_max, lo = adv_clip_min (None: -c); cosmos-rl clamps A to
    [advantage_low, advantage_high] and divides by advantage_high the same way.

    Works on numpy and jax arrays alike (the NFT loss calls it on device).
    """
    xp = np if isinstance(adv, (np.ndarray, np.generic, float, int)) else jnp
    a = xp.clip(adv, -adv_clip_max if adv_clip_min is None else adv_clip_min, adv_clip_max)
    return xp.clip((a / adv_clip_max) / 2.0 + 0.5, 0.0, 1.0)


def ddrl_advantages(rewards, group_keys, *, exp_reward: bool = False, clip_min: float | None = -5.0,
                    clip_max: float | None = 5.0, eps: float = 1e-4):
    """DDRL advantages (cosmos-rl wfm trainer, spec §4).

    rewards: (N,) or (M, N) for M reward models. Per model and group (the `num_rollout` replicas
    of one prompt): A = (r - mean) / (unbiased std + eps); a group of one keeps A = r, as the code
    does. Models are averaged, then exp_reward maps A -> -exp(-A) (cosmos-rl's default and its
    released DDRL recipes: off), then A is clipped (clip_min / clip_max None: left to the caller,
    the RL loop clips every algorithm's advantages once).
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
    if clip_min is not None or clip_max is not None:
        a = np.clip(a, clip_min, clip_max)
    return a.astype(np.float32)
