"""Advantages, the NFT r mapping and the averaging rules against independent numpy written from
spec algorithms.md §2-§4 and issue C item 6."""

import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.algorithms import advantages as A
from wfm_jax.algorithms import decay as D
from wfm_jax.programs.ema import soft_update


def _grpo_numpy(rewards, prompts, global_std):
    rewards = np.asarray(rewards, np.float64)
    out = np.zeros_like(rewards)
    for p in set(prompts):
        idx = [i for i, q in enumerate(prompts) if q == p]
        mean = rewards[idx].mean(axis=0)
        std = (rewards.std(axis=0) if global_std else rewards[idx].std(axis=0)) + 1e-4
        out[idx] = (rewards[idx] - mean) / std
    return out


@pytest.mark.parametrize("global_std", [True, False])
def test_group_advantages_match_numpy(global_std):
    rng = np.random.default_rng(0)
    prompts = [f"prompt {i % 3}" for i in range(12)]
    rng.shuffle(prompts)
    rewards = rng.normal(0.5, 0.2, 12)
    got = A.group_advantages(rewards, prompts, global_std=global_std)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _grpo_numpy(rewards, prompts, global_std), rtol=1e-6)
    # rewards repeated over trained timesteps (N, K) give the same advantage in every column
    got2 = A.group_advantages(np.repeat(rewards[:, None], 3, axis=1), prompts, global_std=global_std)
    np.testing.assert_allclose(got2, np.repeat(got[:, None], 3, axis=1), rtol=1e-6)
    # integer group ids work as keys too
    ids = np.array([int(p[-1]) for p in prompts])
    np.testing.assert_array_equal(A.group_advantages(rewards, ids, global_std=global_std), got)
    with pytest.raises(ValueError, match="group keys"):
        A.group_advantages(rewards, ids[:5])


def test_clip_and_nft_optimality():
    adv = np.array([-12.0, -5.0, -2.5, 0.0, 1.0, 5.0, 8.0])
    np.testing.assert_array_equal(A.clip_advantages(adv, 5.0), np.clip(adv, -5, 5))
    want = np.clip(0.5 + 0.5 * np.clip(adv, -5, 5) / 5, 0, 1)  # paper: 1/2 + 1/2 clip(A/Z, -1, 1)
    np.testing.assert_allclose(A.nft_optimality(adv, 5.0), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(A.nft_optimality(jnp.asarray(adv, jnp.float32), 5.0)), want, rtol=1e-6)


def _ddrl_numpy(rewards, groups, exp_reward, lo=-5.0, hi=5.0):
    rewards = np.atleast_2d(np.asarray(rewards, np.float64))
    adv = np.zeros(rewards.shape[1])
    for model_rewards in rewards:
        a = np.zeros_like(model_rewards)
        for g in set(groups):
            idx = [i for i, h in enumerate(groups) if h == g]
            r = model_rewards[idx]
            a[idx] = r if len(idx) == 1 else (r - r.mean()) / (np.std(r, ddof=1) + 1e-4)
        adv += a / rewards.shape[0]
    if exp_reward:
        adv = -np.exp(-adv)
    return np.clip(adv, lo, hi)


@pytest.mark.parametrize("exp_reward", [True, False])
def test_ddrl_advantages_match_numpy(exp_reward):
    rng = np.random.default_rng(1)
    groups = [0] * 4 + [1] * 4 + [2]  # two groups of num_rollout = 4 and a lone sample
    rewards = rng.normal(0.0, 1.5, (2, 9))  # two reward models
    rewards[0, 8] = 7.0
    got = A.ddrl_advantages(rewards, groups, exp_reward=exp_reward)
    np.testing.assert_allclose(got, _ddrl_numpy(rewards, groups, exp_reward), rtol=1e-6)
    assert got.min() >= -5.0 and got.max() <= 5.0
    got1 = A.ddrl_advantages(rewards[0], groups, exp_reward=exp_reward)
    np.testing.assert_allclose(got1, _ddrl_numpy(rewards[0], groups, exp_reward), rtol=1e-6)


# ----------------------------------------------------------------------------- decay and EMA


def test_old_policy_decay_schedules():
    for step in range(0, 2000, 7):
        assert D.old_policy_decay(step, 0) == 0.0
        assert D.old_policy_decay(step, 1) == pytest.approx(min(0.001 * step, 0.5))
        want2 = 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
        assert D.old_policy_decay(step, 2) == pytest.approx(want2)
        assert D.old_policy_decay(step, 1, max_decay=0.95) == pytest.approx(min(0.001 * step, 0.95))
    with pytest.raises(ValueError, match="decay_type"):
        D.old_policy_decay(3, 5)


def test_soft_update_and_type0_copies():
    rng = np.random.default_rng(2)
    old = {"a": rng.standard_normal((3, 2)).astype(np.float32), "b": [rng.standard_normal(4).astype(np.float32)]}
    new = {"a": rng.standard_normal((3, 2)).astype(np.float32), "b": [rng.standard_normal(4).astype(np.float32)]}
    eta = D.old_policy_decay(300, 1)
    got = soft_update(jax_tree(old), jax_tree(new), eta)
    for g, o, n in ((got["a"], old["a"], new["a"]), (got["b"][0], old["b"][0], new["b"][0])):
        np.testing.assert_allclose(np.asarray(g), o.astype(np.float64) * eta + n.astype(np.float64) * (1 - eta), rtol=1e-6)
    copied = soft_update(jax_tree(old), jax_tree(new), D.old_policy_decay(300, 0))
    np.testing.assert_array_equal(np.asarray(copied["a"]), new["a"])


def jax_tree(tree):
    return {"a": jnp.asarray(tree["a"]), "b": [jnp.asarray(tree["b"][0])]}
