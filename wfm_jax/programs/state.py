"""The train state as one pytree, and the optimizer + EMA step over it (jit-friendly).

Loops keep the model as `graphdef, params, rest = nnx.split(model, wrt, ...)` once, carry a
`TrainState` through a plain `jax.jit(..., donate_argnums=...)` step and `nnx.merge` inside;
the whole state goes to `Checkpointer.save` as is, so resume restores every field.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from wfm_jax.programs.ema import ema_init, ema_update
from wfm_jax.programs.optim import apply_gradients


class TrainState(struct.PyTreeNode):
    """step: optimizer updates applied so far (int32; micro-steps of an accumulation window do
    not count). params: the trained pytree (full params or LoRA only). opt_state: optax state.
    ema: EMA shadow of params, or None when EMA is off. rng: typed PRNG key. aux: other arrays
    that must survive a resume (e.g. the RL "old" policy), a dict."""
    step: jax.Array
    params: Any
    opt_state: Any
    ema: Any
    rng: jax.Array
    aux: Any = struct.field(default_factory=dict)

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation, rng: jax.Array,
               ema: bool = False, aux: dict | None = None) -> TrainState:
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                   ema=ema_init(params) if ema else None, rng=rng, aux=dict(aux or {}))


def train_state_update(state: TrainState, grads: Any, tx: optax.GradientTransformation,
                       ema_decay: float = 0.0, ema_interval: int = 0) -> tuple[TrainState, dict]:
    """Apply one (micro-)step of gradients; bump `step` and update the EMA only when the
    optimizer really updated. Returns (state, info) with info["grad_norm"], info["updated"]."""
    params, opt_state, info = apply_gradients(tx, state.params, state.opt_state, grads)
    step = state.step + info["updated"].astype(jnp.int32)
    ema = ema_update(state.ema, params, step, ema_decay, ema_interval, when=info["updated"])
    return state.replace(step=step, params=params, opt_state=opt_state, ema=ema), info
