"""Parameter averaging rules: DiffusionNFT's old-policy soft update and the EMA warm-up
(spec algorithms.md §3, issue C item 6).
"""

from __future__ import annotations

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


def soft_update(old, new, decay):
    """old * decay + new * (1 - decay) leaf by leaf (float math in the leaf's dtype)."""
    return jax.tree.map(lambda o, n: (o * decay + n * (1.0 - decay)).astype(o.dtype), old, new)


def ema_decay(step, decay: float):
    """EMA warm-up min((1 + s) / (10 + s), decay) (flow_grpo / cosmos-rl EMAModuleWrapper)."""
    if isinstance(step, (int, float)):
        return min((1 + step) / (10 + step), decay)
    step = jnp.asarray(step, jnp.float32)
    return jnp.minimum((1 + step) / (10 + step), decay)


def ema_due(step: int, interval: int) -> bool:
    """Whether the EMA updates after optimisation step `step`: (step + 1) % interval == 0;
    interval <= 0 means EMA off (never a modulo by zero)."""
    return interval > 0 and (step + 1) % interval == 0


def ema_update(ema, params, step, decay: float):
    """ema += (1 - d)(params - ema) with d = ema_decay(step, decay), leaf by leaf."""
    one_minus = 1.0 - ema_decay(step, decay)
    return jax.tree.map(lambda e, p: (e + one_minus * (p.astype(e.dtype) - e)).astype(e.dtype), ema, params)
