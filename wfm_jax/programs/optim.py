"""AdamW with warm-up + constant/cosine learning rate, global-norm clipping and accumulation.

Everything here is an optax transformation over an arbitrary pytree (a dict of arrays, an
`nnx.State` of trainable parameters, ...), so it runs inside one `jax.jit` next to the model call.
It also works as the `tx` of `nnx.Optimizer(model, tx, wrt=nnx.Param | nnx.LoRAParam)`.

Step counting: the schedule is indexed by `count`, the number of optimizer updates already applied
(0 for the first update), exactly as optax counts. With gradient accumulation the count advances
once per `grad_accum_steps` micro-steps, so `lr_at(count)` is the rate of the (count+1)-th update.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine")


def optimizer_updates(loop_steps: int, calls_per_step: int = 1, grad_accum_steps: int = 1) -> int:
    """How many updates a run applies when each loop step calls the optimizer `calls_per_step`
    times and every `grad_accum_steps`-th call closes an accumulation window (the schedule's
    total_steps counts these, not loop steps)."""
    if min(loop_steps, calls_per_step, grad_accum_steps) < 1:
        raise ValueError(f"loop_steps={loop_steps}, calls_per_step={calls_per_step} and "
                         f"grad_accum_steps={grad_accum_steps} must be >= 1")
    return int(loop_steps) * int(calls_per_step) // int(grad_accum_steps)


def make_lr_schedule(lr: float, warmup_steps: int = 0, schedule: str = "constant",
                     total_steps: int | None = None,
                     min_lr_ratio: float = 0.0) -> Callable[[Any], jax.Array]:
    """Learning rate as a function of the update count (0-based), usable in and out of jit.

    Same shape as cosmos-rl's (torchtitan's) LambdaLR factor:
      count <  W:  lr * (count + 1) / W                      (linear warm-up, never 0)
      count >= W:  constant: lr
                   cosine:   lr * (m + (1 - m) * 0.5 * (1 + cos(pi * p))),
                             p = min((count - W) / (T - W), 1), m = min_lr_ratio
    with W = warmup_steps and T = total_steps (number of optimizer updates in the run).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; expected one of {SCHEDULES}")
    if lr <= 0:
        raise ValueError(f"learning rate must be > 0, got {lr}")
    warmup_steps = int(warmup_steps or 0)
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if schedule == "cosine" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(f"cosine schedule needs total_steps > warmup_steps "
                         f"(got total_steps={total_steps}, warmup_steps={warmup_steps})")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")

    def lr_at(count):
        c = jnp.asarray(count, jnp.float32)
        warm = (c + 1.0) / max(warmup_steps, 1)
        if schedule == "constant":
            after = jnp.ones_like(c)
        else:
            p = jnp.clip((c - warmup_steps) / (total_steps - warmup_steps), 0.0, 1.0)
            after = min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        return lr * jnp.where(c < warmup_steps, warm, after)

    return lr_at


def make_optimizer(lr: float, weight_decay: float = 0.0,
                   betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                   grad_norm_clip: float | None = None, warmup_steps: int = 0,
                   schedule: str = "constant", total_steps: int | None = None,
                   grad_accum_steps: int = 1, min_lr_ratio: float = 0.0,
                   weight_decay_mask: Any = None) -> optax.GradientTransformation:
    """AdamW (decoupled decay, torch semantics) behind optional global-norm clipping.

    grad_norm_clip 0/None: no clipping. grad_accum_steps k > 1: `optax.MultiSteps` averages k
    micro-step gradients and applies one update every k-th call (the other calls return zero
    updates); clipping acts on that averaged gradient, as in a torch loop that clips before
    `optimizer.step()`.
    """
    if grad_accum_steps is None or int(grad_accum_steps) < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {grad_accum_steps}")
    if len(betas) != 2:
        raise ValueError(f"betas must be (b1, b2), got {betas!r}")
    schedule_fn = make_lr_schedule(lr, warmup_steps, schedule, total_steps, min_lr_ratio)
    parts = []
    if grad_norm_clip:
        if grad_norm_clip < 0:
            raise ValueError(f"grad_norm_clip must be >= 0, got {grad_norm_clip}")
        parts.append(optax.clip_by_global_norm(float(grad_norm_clip)))
    parts.append(optax.adamw(schedule_fn, b1=float(betas[0]), b2=float(betas[1]), eps=float(eps),
                             weight_decay=float(weight_decay), mask=weight_decay_mask))
    tx = optax.chain(*parts)
    if int(grad_accum_steps) > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=int(grad_accum_steps)).gradient_transformation()
    return tx


def apply_gradients(tx: optax.GradientTransformation, params: Any, opt_state: Any,
                    grads: Any) -> tuple[Any, Any, dict]:
    """One (micro-)step: returns (params, opt_state, info); jit-friendly.

    info["grad_norm"]: global norm of the gradient the optimizer will apply, before clipping:
    with accumulation, the running mean of the current window (on the last micro-step exactly
    the averaged gradient that gets clipped and applied). info["updated"]: whether this call
    changed the parameters (always True without accumulation).
    """
    if isinstance(opt_state, optax.MultiStepsState):
        k = opt_state.mini_step.astype(jnp.float32)
        mean = jax.tree.map(lambda a, g: a + (g.astype(a.dtype) - a) / (k + 1.0),
                            opt_state.acc_grads, grads)
        grad_norm = optax.global_norm(mean)
    else:
        grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"grad_norm": grad_norm, "updated": did_update(opt_state)}


def did_update(opt_state: Any) -> jax.Array:
    """True when the last `tx.update` applied a real update (accumulation window closed)."""
    if isinstance(opt_state, optax.MultiStepsState):
        return opt_state.mini_step == 0
    return jnp.asarray(True)
