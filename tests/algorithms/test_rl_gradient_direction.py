"""Flow-GRPO's and DDRL's policy gradients point uphill on the reward: on the toy velocity network
(tests/_rl_toy.py) with a differentiable reward, minus the loss gradient of one large batch of
rollouts is compared with the pathwise gradient of the expected reward (jax.grad through the
same sampler with the same noise: exact by reparameterisation). A sign error anywhere in the
chain (advantages, the PPO surrogate, the step's mean or log-prob, which state a step is
evaluated at) turns the cosine negative or to ~0; the loss-level numpy tests cannot see that,
since they check the formulas, not that minimising them raises the reward."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _rl_toy as toy
from tests.train.test_rl_ddrl import ddrl_config
from tests.train.test_rl_grpo import grpo_config
from wfm_jax.algorithms.advantages import ddrl_advantages, group_advantages
from wfm_jax.algorithms.ddrl.algorithm import DDRL
from wfm_jax.algorithms.grpo.algorithm import GRPO

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

N = 4096  # rollouts of one prompt: enough for the score-function estimate to settle


def reward(x):
    return -jnp.mean((x - 0.5) ** 2, axis=(1, 2, 3))


def _cosine(grads, pathwise) -> float:
    a = np.concatenate([-np.ravel(grads[k]) for k in ("w", "p")])  # descent on the loss
    b = np.concatenate([np.ravel(pathwise[k]) for k in ("w", "p")])  # ascent on the reward
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _check(algo, advantages, min_cos):
    params = toy.params(0)
    cond = jax.tree.map(lambda a: jnp.broadcast_to(a, (N,) + a.shape[1:]), toy.cond(1, batch=1))
    latents = jax.random.normal(jax.random.key(3), (N, toy.C, toy.H, toy.W))
    key = jax.random.key(4)
    roll = jax.jit(lambda p: algo.rollout(toy.velocity, toy.Holder(p), latents, cond, key))
    fields = roll(params)
    r = np.asarray(reward(fields["final"]))
    batch = {k: fields[k] for k in algo.train_fields}
    batch.update(cond=cond, advantage=jnp.asarray(advantages(r, np.zeros(N, np.int32))))
    grads, _, _ = jax.jit(lambda p: algo.grads(toy.velocity, toy.Holder(p), p, batch, key,
                                               first=True))(params)
    pathwise = jax.grad(lambda p: reward(roll(p)["final"]).mean())(params)
    cos = _cosine(grads, pathwise)
    assert cos > min_cos, cos
    # and the other way round: rewarding the opposite turns it around
    batch["advantage"] = -batch["advantage"]
    flipped = jax.jit(lambda p: algo.grads(toy.velocity, toy.Holder(p), p, batch, key,
                                           first=True))(params)[0]
    assert _cosine(flipped, pathwise) < -min_cos


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_grpo_gradient_is_the_reward_gradient(fraction):
    # all steps trained: the estimator is unbiased for grad E[R] (measured cos 0.995); half of
    # them: the part of it that acts on those steps (0.977)
    algo = GRPO.from_recipe(grpo_config(**{"policy.diffusers.sample.guidance_scale": 1.0,
                               "train.train_policy.kl_beta": 0.0,
                               "train.train_policy.timesteps_fraction": fraction}), 3.0)
    _check(algo, lambda r, g: group_advantages(r, g), 0.9)


@pytest.mark.parametrize("exp_reward", [False, True])
def test_ddrl_policy_gradient_points_uphill(exp_reward):
    # the unscaled log-ratio weights step k by 2 std_k^2 and exp_reward maps A -> -exp(-A)
    # (every advantage negative): still uphill (measured cos 0.98 / 0.94)
    algo = DDRL.from_recipe(ddrl_config(**{"train.train_policy.train_on": (0, 1, 2, 3, 4),
                               "train.train_policy.kl_beta": 0.0,
                               "train.train_policy.data_beta": 0.0}), 3.0)
    _check(algo, lambda r, g: ddrl_advantages(r, g, exp_reward=exp_reward), 0.85)
