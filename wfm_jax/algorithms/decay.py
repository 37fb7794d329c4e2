"""DiffusionNFT's old-policy decay schedule and soft update (spec algorithms.md §3). The EMA
with its warm-up rule lives in wfm_jax.programs.ema.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# decay_type -> (flat steps, rate per step, cap); eta = 0 before `flat`, then min(rate (s - flat), cap)
OLD_POLICY_DECAYS = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def old_policy_decay(step: int, decay_type: int = 1, max_decay=None) -> float:
    """eta for theta_old <- eta theta_old + (1 - eta) theta after an epoch (`return_decay`).

    type 0: 0 (copy every time); type 1: min(0.001 step, 0.5); type 2: 0 for step < 75, then
    min(0.0075 (step - 75), 0.999). max_decay overrides the cap (multi-reward OCR stage: 0.95).
    """
    if decay_type not in OLD_POLICY_DECAYS:
        raise ValueError(f"unknown decay_type {decay_type}; choose one of {sorted(OLD_POLICY_DECAYS)}")
    flat, rate, cap = OLD_POLICY_DECAYS[decay_type]
    if max_decay is not None:
        cap = max_decay
    if step < flat:
        return 0.0
    return min((step - flat) * rate, cap)


def soft_update(old: Any, new: Any, eta) -> Any:
    """Old-policy soft update: eta * old + (1 - eta) * new, leafwise (eta may be traced).

    eta 0 copies `new`; eta 1 keeps `old` (eta from old_policy_decay).
    """
    eta = jnp.asarray(eta, jnp.float32)
    return jax.tree.map(
        lambda o, n: (eta * o.astype(jnp.float32) + (1.0 - eta) * n.astype(jnp.float32)
                      ).astype(o.dtype), old, new)
