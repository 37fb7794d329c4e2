"""Run a DDRL recipe and log how its gradient splits over the trained steps: for each trained
step j (train_on's order), the norm of its policy-loss gradient and its share of the whole
update's gradient, <g_j, g> / <g, g> (the shares of the policy steps and the data term sum to
1 with KL off), and the same for the data term. Each micro-batch's figures are computed from
the same forwards the update uses, then averaged as the update's metrics are. Measures what
docs/shapes_world.md ("DDRL's steps weighted alike") derives from the loss's form.

    python tools/ddrl_step_gradients.py --config configs/tiny_ddrl.py --config.train.max_steps=10 \
        [--config.train.train_policy.log_ratio_norm=none] [overrides]

Adds train/step_grad_norm_<j>, train/step_grad_share_<j>, train/data_grad_norm and
train/data_grad_share to metrics.jsonl; costs one more backward per trained step.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.ddrl.algorithm import DDRL
from wfm_jax.algorithms.ddrl.loss import ddrl_policy_loss
from wfm_jax.cli.main import main

F32 = jnp.float32


def _dot(a, b):
    return sum(jnp.vdot(x.astype(F32), y.astype(F32)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def log_step_gradients() -> None:
    """Wrap DDRL.grads: the update's gradient as before, plus each part's norm and share."""
    real = DDRL.grads

    def grads(self, velocity, state, ref_params, batch, key, *, old=None, first=True, uncond=None, **shared):
        total, metrics, olds = real(self, velocity, state, ref_params, batch, key, old=old, first=first,
                                    uncond=uncond, **shared)
        scale = self.loss_scale / self.num_train  # as DDRL.grads weighs each step

        def policy(params, j):
            mean = self.mean_at(velocity, params, batch, j, uncond)
            mean_old = jax.lax.stop_gradient(mean) if first else old[:, j]
            std = batch["std"][:, j] if self.norm_by_std else None
            loss, _, _ = ddrl_policy_loss(batch["x_next"][:, j], mean, mean_old, batch["advantage"],
                                          self.clip_range, std)
            return loss * scale

        whole = _dot(total, total)
        metrics = dict(metrics)
        for j in range(self.num_train):
            g = jax.grad(policy)(state.params, j)
            metrics[f"step_grad_norm_{j}"] = jnp.sqrt(_dot(g, g))
            metrics[f"step_grad_share_{j}"] = _dot(g, total) / whole
        if self.data_beta:
            def data(params):  # the data term of trained step 0 (data_on_first_only) or of every step
                steps = [0] if self.data_on_first_only else range(self.num_train)
                return sum(self.data_loss_at(velocity, params, batch, j, key) for j in steps) * (
                    self.data_beta * scale)
            g = jax.grad(data)(state.params)
            metrics["data_grad_norm"] = jnp.sqrt(_dot(g, g))
            metrics["data_grad_share"] = _dot(g, total) / whole
        return total, metrics, olds

    DDRL.grads = grads  # type: ignore[method-assign]


if __name__ == "__main__":
    log_step_gradients()
    sys.exit(main(sys.argv[1:]))
