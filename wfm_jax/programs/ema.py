"""EMA shadow of trained parameters and the old-policy soft update (algorithms.decay), as pure
pytree functions.

The EMA rule (cosmos-rl / flow_grpo `EMAModuleWrapper`, originally LitEma's warm-up):

    n       = number of EMA updates so far, counting this one (1 at the first update)
    d_eff   = min((1 + n) / (10 + n), decay)
    ema    <- ema + (1 - d_eff) * (params - ema)

applied after optimizer update number `step` (1-based) whenever `step % interval == 0`, so
n = step // interval. With interval 1 (the cosmos-rl recipes) n equals the optimizer step that
cosmos-rl passes to `get_current_decay`, so the two agree update for update. For interval > 1
cosmos-rl updates when `(step + 1) % interval == 0` and ramps with the step rather than the
update count; here the warm-up counts EMA updates. interval 0 turns EMA off (cosmos-rl crashes
with a modulo by zero there).

Blends run in float32 and are cast back to each leaf's dtype.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.decay import soft_update  # noqa: F401 -- the old-policy blend lives with NFT's decay


def ema_init(params: Any) -> Any:
    """A separate copy of `params` (own buffers, same shardings), safe to keep while the
    train step donates `params`."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), params)


def ema_decay(n_updates, decay: float) -> jax.Array:
    """Effective decay of the n-th EMA update (n >= 1): min((1 + n) / (10 + n), decay)."""
    n = jnp.asarray(n_updates, jnp.float32)
    return jnp.minimum((1.0 + n) / (10.0 + n), jnp.float32(decay))


def ema_update(ema: Any, params: Any, step, decay: float, interval, when=True) -> Any:
    """EMA after optimizer update `step` (1-based); a no-op unless interval > 0, step > 0,
    step % interval == 0 and `when` (e.g. "the accumulation window closed") all hold.

    `step`, `interval` and `when` may be traced values; the branch is a `lax.cond`, so skipped
    steps cost no arithmetic. A Python `interval` of 0 (or None) returns `ema` untouched.
    """
    if ema is None or (isinstance(interval, int) and interval <= 0) or interval is None:
        return ema
    step = jnp.asarray(step, jnp.int32)
    interval = jnp.asarray(interval, jnp.int32)
    safe_interval = jnp.maximum(interval, 1)  # never a modulo by zero, even when traced
    do = (interval > 0) & (step > 0) & (step % safe_interval == 0) & jnp.asarray(when)
    d = ema_decay(step // safe_interval, decay)

    def blend(e, p):
        return jax.tree.map(
            lambda a, b: (a.astype(jnp.float32)
                          + (1.0 - d) * (b.astype(jnp.float32) - a.astype(jnp.float32))
                          ).astype(a.dtype), e, p)

    return jax.lax.cond(do, blend, lambda e, p: e, ema, params)
