"""Algorithm defaults against their sources (issue 18, item 2), each against independent numpy:
cosmos-rl's per-prompt unbiased std, both advantage bounds applied once, the NFT r with an
asymmetric clip, flow_grpo's zero-advantage filter and zero_std_ratio, the CFG detach switch,
and the recipe / schema defaults that follow cosmos-rl."""
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.algorithms import advantages as A
from wfm_jax.algorithms.base import RLAlgorithm
from wfm_jax.algorithms.grpo import grpo_loss
from wfm_jax.algorithms.grpo.algorithm import cfg_velocity
from wfm_jax.config.recipe import load_config
from wfm_jax.config.schema import default_config
from wfm_jax.train import rl

REPO = REPO_ROOT


def _cosmos_rl_numpy(rewards, groups):
    """cosmos-rl RemoteRewardCalculator: per payload (prompt) (r - mean) / (torch std + 1e-4),
    torch's std being unbiased; a NaN result (one sample) becomes 0."""
    out = np.zeros(len(rewards))
    for g in dict.fromkeys(groups):
        idx = [i for i, h in enumerate(groups) if h == g]
        r = np.asarray(rewards, np.float64)[idx]
        std = np.std(r, ddof=1) if len(r) > 1 else np.nan
        a = (r - r.mean()) / (std + 1e-4)
        out[idx] = np.zeros_like(a) if np.isnan(a).any() else a
    return out


def test_per_prompt_unbiased_std_matches_cosmos_rl():
    rng = np.random.default_rng(3)
    groups = [0, 1, 2] * 4 + [3]  # three groups of 4 and a lone sample
    rewards = rng.normal(0.3, 0.5, len(groups))
    got = A.group_advantages(rewards, groups, global_std=False, ddof=1)
    np.testing.assert_allclose(got, _cosmos_rl_numpy(rewards, groups), rtol=1e-6)
    assert got[-1] == 0.0
    # the global unbiased std: every sample divided by the batch's std with ddof 1
    got = A.group_advantages(rewards, groups, global_std=True, ddof=1)
    means = {g: rewards[[i for i, h in enumerate(groups) if h == g]].mean() for g in set(groups)}
    want = (rewards - np.array([means[g] for g in groups])) / (np.std(rewards, ddof=1) + 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_zero_std_ratio_matches_flow_grpo():
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    rewards = np.array([1.0, 1.0, 0.5, 0.7, 0.2, 0.2, 0.0, 1.0])
    want = np.mean([np.std(rewards[groups == g]) == 0 for g in np.unique(groups)])
    assert A.zero_std_ratio(rewards, groups) == want == 0.5


class _GroupNormalised:
    """An algorithm with RLAlgorithm's default advantages."""
    advantages = RLAlgorithm.advantages


def _fake_run(algo, low, high, global_std=True, ddof=0):
    return types.SimpleNamespace(algo=algo, global_std=global_std, std_ddof=ddof,
                                 adv_range=(low, high))


def _advantages(run, rewards, groups):
    rollout = {"reward": np.asarray(rewards, np.float32), "keep": np.ones(len(rewards), bool),
               "dropped_groups": 0, "per_fn": {}}
    return rl.advantages_for(run, rollout, {"group": np.asarray(groups)})


def test_loop_clips_once_to_both_bounds():
    groups = [0] * 4 + [1] * 4
    rewards = np.array([0.0, 0.0, 0.0, 10.0, 1.0, 2.0, 3.0, 4.0])
    adv, metrics = _advantages(_fake_run(_GroupNormalised(), -0.5, 1.0), rewards, groups)
    raw = A.group_advantages(rewards, groups)
    np.testing.assert_allclose(adv, np.clip(raw, -0.5, 1.0), rtol=1e-6)
    assert adv.min() == pytest.approx(-0.5) and adv.max() == pytest.approx(1.0)
    assert metrics["rollout/zero_std_ratio"] == 0.0


class _DDRLLike:
    def advantages(self, rewards, groups, *, global_std=True, ddof=0):
        return A.ddrl_advantages(rewards, groups, exp_reward=True, clip_min=None, clip_max=None)


def test_ddrl_advantages_are_clipped_once_with_the_low_bound():
    groups = [0] * 4
    rewards = np.array([0.0, 0.1, 0.2, 3.0])
    adv, _ = _advantages(_fake_run(_DDRLLike(), -10.0, 1.0), rewards, groups)
    r = rewards.astype(np.float64)
    a = -np.exp(-(r - r.mean()) / (np.std(r, ddof=1) + 1e-4))  # exp_reward
    np.testing.assert_allclose(adv, np.clip(a, -10.0, 1.0), rtol=1e-5)
    assert adv.min() < -1.0  # before: clipped a second time to -advantage_high


def test_nft_optimality_with_asymmetric_bounds_matches_cosmos_rl():
    adv = np.array([-12.0, -3.0, -1.0, 0.0, 2.0, 7.0])
    lo, hi = -2.0, 5.0
    want = np.clip(np.clip(adv, lo, hi) / hi / 2.0 + 0.5, 0.0, 1.0)  # nft_trainer.py
    np.testing.assert_allclose(A.nft_optimality(adv, hi, lo), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(A.nft_optimality(jnp.asarray(adv, jnp.float32), hi, lo)),
                               want, rtol=1e-6)


def test_grpo_zero_advantage_filter_matches_dropping_the_rows():
    rng = np.random.default_rng(0)
    lp, old = rng.normal(0, 1e-4, 6), rng.normal(0, 1e-4, 6)
    adv = np.array([1.0, 0.0, -2.0, 0.0, 0.5, 7.0])
    mean, ref, std = rng.normal(size=(6, 2, 2)), rng.normal(size=(6, 2, 2)), 0.7
    keep = adv != 0

    def numpy_loss(lp, old, adv, mean, ref, lo=-5.0, hi=5.0, eps=1e-4, beta=0.1):
        a = np.clip(adv, lo, hi)
        ratio = np.exp(lp - old)
        pol = np.mean(np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps, 1 + eps)))
        kl = np.mean(((mean - ref) ** 2 / (2 * std**2)).mean(axis=(1, 2)))
        return pol + beta * kl

    f32 = lambda x: jnp.asarray(x, jnp.float32)
    got, _ = grpo_loss(f32(lp), f32(old), f32(adv), kl_beta=0.1, mean=f32(mean), ref_mean=f32(ref),
                       std_dev_t=std, weight=f32(keep), adv_clip_min=-1.0)
    want = numpy_loss(lp[keep], old[keep], adv[keep], mean[keep], ref[keep], lo=-1.0)
    assert float(got) == pytest.approx(want, rel=1e-5)
    unfiltered, _ = grpo_loss(f32(lp), f32(old), f32(adv), kl_beta=0.1, mean=f32(mean),
                              ref_mean=f32(ref), std_dev_t=std)
    assert float(unfiltered) == pytest.approx(numpy_loss(lp, old, adv, mean, ref), rel=1e-5)


@pytest.mark.parametrize("detach", [True, False])
def test_cfg_detach_switch(detach):
    def velocity(p, x, t, c):  # linear in the parameter: d v / d p = c * x
        return p * c * x

    x, c, u, g = jnp.full((2, 3), 2.0), jnp.full((2, 1), 3.0), jnp.full((1, 1), 0.5), 4.5
    grad = jax.grad(lambda p: cfg_velocity(velocity, p, x, jnp.zeros(2), c, u, g,
                                           detach_uncond=detach).sum())(1.0)
    per = x.size * 2.0  # sum of x
    want = g * 3.0 * per if detach else (g * 3.0 + (1 - g) * 0.5) * per
    assert float(grad) == pytest.approx(want)


def test_defaults_follow_cosmos_rl_where_documented():
    tp = default_config().train.train_policy
    assert tp.exp_reward is False and tp.global_std is True and tp.std_ddof == 0
    assert tp.cfg_detach_uncond is True and tp.filter_zero_advantage is False
    ddrl = load_config(os.path.join(REPO, "configs/sd35_ddrl.py"))
    assert ddrl.train.train_policy.exp_reward is False
    nft = load_config(os.path.join(REPO, "configs/sd35_nft.py"))
    assert nft.train.train_policy.global_std is False and nft.train.train_policy.std_ddof == 1
