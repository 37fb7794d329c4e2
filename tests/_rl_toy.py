"""A toy conditional velocity network in JAX and float64 numpy (same formula) for trainer-level
Flow-GRPO / DDRL tests: v = tanh(W x) (1 + t / 1000) + p * pooled, channels mixed by W."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

B, C, H, W = 4, 3, 4, 4
RECIPES = os.path.join(os.path.dirname(__file__), "..", "configs")


def velocity(params, x, t, cond):
    h = jnp.einsum("bchw,cd->bdhw", x, params["w"])
    tt = (t / 1000.0)[:, None, None, None]
    return jnp.tanh(h) * (1.0 + tt) + params["p"] * cond["pooled_projections"][:, :, None, None]


def velocity_np(params, x, t, pooled):
    w, p = (np.asarray(params[k], np.float64) for k in ("w", "p"))
    h = np.einsum("bchw,cd->bdhw", np.asarray(x, np.float64), w)
    tt = (np.asarray(t, np.float64) / 1000.0)[:, None, None, None]
    return np.tanh(h) * (1.0 + tt) + p * np.asarray(pooled, np.float64)[:, :, None, None]


def params(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(0, 0.6, (C, C)), jnp.float32),
            "p": jnp.asarray(0.7, jnp.float32)}


def cond(seed=1, batch=B):
    rng = np.random.default_rng(seed)
    return {"prompt_embeds": jnp.zeros((batch, 1, 1), jnp.float32),
            "pooled_projections": jnp.asarray(rng.normal(size=(batch, C)), jnp.float32)}


class Holder:
    """The `state` an algorithm's rollout reads (.params, .aux)."""

    def __init__(self, params, aux=None):
        self.params, self.aux = params, aux or {}


def f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


def metrics(out_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return {r["step"]: r for r in rows}


def assert_reward_rises(m: dict) -> None:
    """Mean of the last 5 steps above the first 5 by more than 3 standard errors."""
    steps = sorted(m)
    rewards = np.array([m[s]["train/reward_mean"] for s in steps])
    first, last = rewards[:5], rewards[-5:]
    se = np.sqrt(first.var(ddof=1) / 5 + last.var(ddof=1) / 5)
    assert last.mean() - first.mean() > 3 * se, (first, last)


PROMPTS = os.path.join(RECIPES, "prompts", "tiny.txt")


def random_model_overrides(lr: float, prompts: bool = True) -> list[str]:
    """The tiny recipes as they were before they moved to the pretrained shapes world: these
    trainer tests run them on the random tiny pipeline (seconds to build) with the JPEG reward,
    the setting their reward-rise thresholds were measured with."""
    args = ['--config.train.train_policy.remote_reward.reward_fns=[{"name": '
            '"jpeg_compressibility", "weight": 1.0, "score_key": ""}]',
            f"--config.train.optm_lr={lr}", "--config.validation.val_before_train=False",
            "--config.validation.dataset.local_dir=", "--config.validation.dataset.holdout_fraction=0.25",
            "--config.validation.batch_size=4"]
    if prompts:
        args.append(f"--config.train.train_policy.dataset.local_dir={PROMPTS}")
    return args
