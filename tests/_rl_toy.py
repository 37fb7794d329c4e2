"""A toy conditional velocity network in JAX and float64 numpy (same formula) for trainer-level
Flow-GRPO / DDRL tests: v = tanh(W x) (1 + t / 1000) + p * pooled, channels mixed by W."""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

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
# the first step counted by the no-recompile checks of the 20-step runs: by then each has
# rolled out, updated, validated (step 10), checkpointed and exported (every 3 or 4 steps) once
EVERY_KIND_RAN = 12


BRIGHTNESS = "test_rl_brightness"


def main_counting_late_compiles(argv: list[str]) -> list[str]:
    """Run `wfm_jax.cli.main(argv)` (it must succeed); the programs compiled from step
    EVERY_KIND_RAN on, which must be none (tests/_support/compiles.py)."""
    from tests._support.compiles import compiles_from_step
    from wfm_jax.cli import main as wmain
    with compiles_from_step(EVERY_KIND_RAN) as compiles:
        assert wmain.main(argv) == 0
    return compiles.names


@contextlib.contextmanager
def brightness_reward(name: str = BRIGHTNESS) -> Iterator[str]:
    """Mean pixel brightness in [0, 1], registered as reward `name` while the block runs (the
    reward server of a test runs in this process and sees it too)."""
    from reward_client.registry import register_reward, unregister_reward

    def brightness(images, prompts, extras):
        return np.asarray(images, np.float64).mean(axis=(1, 2, 3)) / 255.0

    register_reward(name)(brightness)
    try:
        yield name
    finally:
        unregister_reward(name)


def random_model_overrides(lr: float, prompts: bool = True) -> list[str]:
    """The tiny recipes as they were before they moved to the pretrained shapes world, run by
    these trainer tests on the random tiny pipeline (seconds to build): 16x16 pictures (64
    tokens; the recipes' 32x32 cost 2-3x the run time) on an 8-way FSDP mesh (as
    `policy.parallelism.fsdp` shards a real model; the no-recompile checks need it), rewarded
    by mean brightness (`brightness_reward` must be active). The JPEG reward the thresholds
    were first measured with moves 16x16 pictures by about 1% (they are mostly JPEG header):
    4.1-4.6 standard errors on some seeds, against 8-25 for brightness (2026-11-27)."""
    args = ['--config.train.train_policy.remote_reward.reward_fns=[{"name": '
            f'"{BRIGHTNESS}", "weight": 1.0, "score_key": ""}}]',
            "--config.policy.diffusers.inference_size=(16, 16)",
            "--config.policy.parallelism.data=1", "--config.policy.parallelism.fsdp=8",
            f"--config.train.optm_lr={lr}", "--config.validation.val_before_train=False",
            # the length, validation and checkpoint cadence these tests were measured with (the
            # shapes-world GRPO and DDRL recipes run 60 steps since 2026-12-04)
            "--config.train.max_steps=20", "--config.validation.freq=10",
            "--config.train.ckpt.save_freq=10",
            "--config.validation.dataset.local_dir=", "--config.validation.dataset.holdout_fraction=0.25",
            "--config.validation.batch_size=4"]
    if prompts:
        args.append(f"--config.train.train_policy.dataset.local_dir={PROMPTS}")
    return args
