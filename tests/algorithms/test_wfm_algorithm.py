"""The "wfm_rl" algorithm (cosmos-rl's world-model RL step, spec cosmos_rl_wfm.md §1) on the
shared loop's interface, against an independent float64 numpy implementation on the toy
velocity network of tests/_rl_toy.py: the rollout follows the EDM sigma grid with churn and
stores what the step trains on; a group shares its initial noise; one update's policy, KL and
data terms, its total loss and its gradient (central differences of the numpy loss); the
advantages; the reference copy schedule."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _rl_toy as toy
from wfm_jax.algorithms.registry import ALGORITHMS, algorithm_named
from wfm_jax.config.schema import default_config

N, GROUP = 4, 2            # sample steps; rows per group (toy.B = 4 rows: two groups)
TRAIN_ON = (1, 2, 3)        # the last step trains against the final clean sample


def recipe(**wfm):
    c = default_config()
    c.train.train_policy.type = "wfm_rl"
    c.rollout.n_generation = GROUP
    w = c.train.train_policy.wfm
    w.sample_steps, w.train_on, w.kl_beta, w.data_beta = N, TRAIN_ON, 0.01, 0.01
    for k, v in wfm.items():
        w[k] = v
    return c


def algo_of(**wfm):
    cls = algorithm_named("wfm_rl")
    return cls(cls.Config.from_recipe(recipe(**wfm)))


# ---------------------------------------------------------------------- numpy reference


def grid_np(n, lo=0.01, hi=200.0, rho=7.0):
    i = np.arange(n + 1) / n
    return (hi ** (1 / rho) + i * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho


def x0_np(params, x, sigma, pooled):
    """cosmos RectifiedFlowScaling: t = s/(1+s), net on (1-t) x at timestep t, x0 = (1-t)x - tF."""
    t = sigma / (1 + sigma)
    v = toy.velocity_np(params, (1 - t) * x, np.full(x.shape[0], t * 1000.0), pooled)
    return (1 - t) * x - t * v


def step_np(x, s, sn, x0, x0_prev, s_prev, first):
    """x0-form Euler on the first step, else the 2nd-order exponential AB step in -log sigma."""
    if first:
        return (s - sn) / s * x0 + sn / s * x
    lam, lam_n, lam_p = -math.log(s), -math.log(sn), -math.log(s_prev)
    h = lam_n - lam
    c2 = (lam_p - lam) / h
    phi1 = (math.exp(-h) - 1) / -h
    phi2 = (phi1 - 1) / -h
    return math.exp(-h) * x + h * ((phi1 - phi2 / c2) * x0 + phi2 / c2 * x0_prev)


def rollout_np(params, noise, churn, pooled, s_churn=1.0):
    """The trajectory from sigma_max * noise with the given churn draws: per step (x_hat,
    sigma_hat, sigma_next, x0, mu), and the final clean sample."""
    sig = grid_np(N)
    eta = min(s_churn / (N + 1), math.sqrt(1.2) - 1)
    x, x0_prev, s_prev, steps = noise * sig[0], None, None, []
    for k in range(N):
        s_hat = (1 + eta) * sig[k]
        x_hat = x + math.sqrt(s_hat**2 - sig[k] ** 2) * churn[k]
        x0 = x0_np(params, x_hat, s_hat, pooled)
        mu = step_np(x_hat, s_hat, sig[k + 1], x0, x0_prev, s_prev, k == 0)
        steps.append(dict(x_hat=x_hat, s_hat=s_hat, s_next=sig[k + 1], x0=x0, mu=mu))
        x, x0_prev, s_prev = mu, x0, s_hat
    return steps, x0_np(params, x, sig[-1], pooled)


def loss_np(params, ref, f, adv, data_x0, pooled, clip=1e-4, kl_beta=0.01, data_beta=0.01,
            scale=10.0):
    """Spec §1 per trained step, summed over the steps: (total, per-step terms, ratios)."""
    total, terms, ratios = 0.0, [], []
    for j in range(len(TRAIN_ON)):
        g = {k: np.asarray(f[k][:, j], np.float64) for k in
             ("noise_x", "sigma", "sigma_next", "mu_old", "sample", "x0_prev", "sigma_prev")}
        first = bool(np.asarray(f["first"][0, j]))
        s, sn, sp = (float(g[k][0]) for k in ("sigma", "sigma_next", "sigma_prev"))

        def mean_of(p, g=g, s=s, sn=sn, sp=sp, first=first):
            return step_np(g["noise_x"], s, sn, x0_np(p, g["noise_x"], s, pooled), g["x0_prev"],
                           sp, first)
        mu, mu_ref = mean_of(params), mean_of(ref)
        ratio = np.exp(np.mean(-((g["sample"] - mu) ** 2 - (g["sample"] - g["mu_old"]) ** 2),
                               axis=(1, 2, 3)))
        pol = np.mean(np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip)))
        kl = np.mean((mu_ref - mu) ** 2)
        eps = np.asarray(f["noise"], np.float64)
        pred = x0_np(params, data_x0 + s * eps, s, pooled)
        data = np.mean((1 + s**2) / s**2 * (data_x0 - pred) ** 2)
        total += (pol + kl_beta * kl + data_beta * data) * scale / len(TRAIN_ON)
        terms.append((pol, kl, data))
        ratios.append(ratio)
    return total, np.asarray(terms), np.asarray(ratios)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rolled():
    algo = algo_of()
    params, cond = toy.params(0), toy.cond(1)
    seeds = algo.group_seeds(3, np.array([0, 0, 1, 1]))
    latents = jnp.zeros((toy.B, toy.C, toy.H, toy.W), jnp.float32)
    key = jax.random.key(5)
    fields = algo.rollout(toy.velocity, toy.Holder(params), latents, cond, key,
                          noise_seed=jnp.asarray(seeds))
    return algo, params, cond, key, fields


def test_registered_and_flow_grpo_kept():
    assert ALGORITHMS["wfm_rl"].name == "wfm_rl"
    assert ALGORITHMS["grpo"].name == "grpo" and ALGORITHMS["ddrl"].name == "ddrl"


def test_same_initial_noise_within_a_group_only(rolled):
    algo, *_, fields = rolled
    noise = np.asarray(fields["noise"])
    np.testing.assert_array_equal(noise[0], noise[1])
    np.testing.assert_array_equal(noise[2], noise[3])
    assert not np.allclose(noise[0], noise[2])
    # a group's seed depends on (run seed, step, group) only: any chunk or process agrees
    s = algo.group_seeds(3, np.array([5, 2, 5, 2]))
    assert s[0] == s[2] != s[1] == s[3] and s[0] == algo.group_seeds(3, np.array([5]))[0]
    assert algo.group_seeds(4, np.array([5]))[0] != s[0]
    # the churn is never shared: same-seed members part at step 0
    assert not np.allclose(np.asarray(fields["noise_x"])[0, 0], np.asarray(fields["noise_x"])[1, 0])
    # use_same_seed off: the loop's independent draw is used as it is
    other = algo_of(use_same_seed=False)
    assert other.initial_noise(jnp.ones((2, 3)), None).tolist() == [[1.0] * 3] * 2
    assert "noise_seed" not in other.abstract_chunk_inputs(None, jax.ShapeDtypeStruct((2, 3), jnp.float32))


def test_rollout_follows_the_edm_grid_with_churn(rolled):
    """The stored steps equal a float64 numpy rollout on the spec's grid and churn, fed the
    sampler's churn draws (the noise contract of sampling.edm)."""
    algo, params, cond, key, fields = rolled
    _, k_churn = jax.random.split(key)
    noise = np.asarray(fields["noise"], np.float64)
    churn = [np.asarray(jax.random.normal(jax.random.fold_in(k_churn, k), noise.shape, jnp.float32),
                        np.float64) for k in range(N)]
    pooled = np.asarray(cond["pooled_projections"], np.float64)
    steps, final = rollout_np({k: np.asarray(v) for k, v in params.items()}, noise, churn, pooled)
    assert algo.plan.eta == pytest.approx(min(1 / (N + 1), math.sqrt(1.2) - 1))  # capped at N = 4
    for j, k in enumerate(TRAIN_ON):
        ref = steps[k]
        np.testing.assert_allclose(np.asarray(fields["sigma"][:, j]), ref["s_hat"], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(fields["sigma_next"][:, j]), ref["s_next"], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(fields["sigma_prev"][:, j]), steps[k - 1]["s_hat"], rtol=1e-6)
        for name, want in (("noise_x", ref["x_hat"]), ("mu_old", ref["mu"]),
                           ("x0_prev", steps[k - 1]["x0"]),
                           ("sample", steps[k + 1]["x_hat"] if k + 1 < N else final)):
            got = np.asarray(fields[name][:, j], np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name)
    np.testing.assert_allclose(np.asarray(fields["final"]), final, rtol=1e-4, atol=1e-4)
    assert not np.asarray(fields["first"]).any()  # step 0 is not in TRAIN_ON


def test_one_update_matches_numpy_term_by_term(rolled):
    """Policy (weights moved off the rollout's, so the ratio is not 1), KL to a different
    reference, data term at the rollout's sigma and noise; total loss and its gradient."""
    algo, params, cond, key, fields = rolled
    rng = np.random.default_rng(7)
    moved = {"w": params["w"] + jnp.asarray(rng.normal(0, 2e-3, (toy.C, toy.C)), jnp.float32),
             "p": params["p"] + 1e-4}
    ref = {"w": params["w"] * 0.9, "p": params["p"] * 1.1}
    rewards = np.array([0.3, 0.9, -0.2, 0.5])
    adv = np.asarray(algo.advantages(rewards, np.array([0, 0, 1, 1])), np.float64)
    data_x0 = jnp.asarray(rng.normal(size=(toy.B, toy.C, toy.H, toy.W)), jnp.float32)
    batch = {name: fields[name] for name in algo.train_fields if name != "data_x0"}
    batch.update(cond=cond, advantage=jnp.asarray(adv, jnp.float32), data_x0=data_x0)
    grads, metrics = algo.grads(toy.velocity, toy.Holder(moved), ref, batch, jax.random.key(0))

    p64 = {k: np.asarray(v, np.float64) for k, v in moved.items()}
    r64 = {k: np.asarray(v, np.float64) for k, v in ref.items()}
    pooled = np.asarray(cond["pooled_projections"], np.float64)
    x0_64 = np.asarray(data_x0, np.float64)
    total, terms, ratios = loss_np(p64, r64, fields, adv, x0_64, pooled)
    # rows inside and outside the clip: both branches of the max are exercised
    dev = np.abs(ratios - 1)
    assert (dev > 2e-4).any() and (dev < 5e-5).any(), ratios
    assert float(metrics["loss"]) == pytest.approx(total, rel=2e-4)
    assert float(metrics["policy_loss"]) == pytest.approx(terms[:, 0].mean(), rel=2e-3, abs=1e-6)
    assert float(metrics["kl_loss"]) == pytest.approx(terms[:, 1].mean(), rel=2e-4)
    assert float(metrics["data_loss"]) == pytest.approx(terms[:, 2].mean(), rel=2e-4)

    def fd(name, idx):
        h = 1e-6
        up, dn = ({k: v.copy() for k, v in p64.items()} for _ in range(2))
        up[name] = np.asarray(up[name], np.float64)
        dn[name] = np.asarray(dn[name], np.float64)
        if up[name].ndim:
            up[name][idx] += h
            dn[name][idx] -= h
        else:
            up[name], dn[name] = up[name] + h, dn[name] - h
        return (loss_np(up, r64, fields, adv, x0_64, pooled)[0]
                - loss_np(dn, r64, fields, adv, x0_64, pooled)[0]) / (2 * h)

    want_w = np.array([[fd("w", (i, j)) for j in range(toy.C)] for i in range(toy.C)])
    np.testing.assert_allclose(np.asarray(grads["w"]), want_w, rtol=2e-3, atol=2e-3 * np.abs(want_w).max())
    assert float(grads["p"]) == pytest.approx(fd("p", ()), rel=2e-3)


def test_terms_switch_off_with_their_weights(rolled):
    algo, params, cond, key, fields = rolled
    off = algo_of(kl_beta=0.0, data_beta=0.0)
    assert "data_x0" not in off.train_fields and not off.reads_data
    batch = {name: fields[name] for name in off.train_fields}
    batch.update(cond=cond, advantage=jnp.asarray([1.0, -1.0, 0.5, -0.5], jnp.float32))
    _, metrics = off.grads(toy.velocity, toy.Holder(params), None, batch, jax.random.key(0))
    assert float(metrics["kl_loss"]) == 0.0 and float(metrics["data_loss"]) == 0.0
    # at the rollout's own weights the ratio is 1 up to float32 rounding of the same step
    assert abs(float(metrics["ratio"]) - 1) < 1e-3


def test_advantages_and_reference_schedule():
    algo = algo_of()
    r = np.array([1.0, 2.0, 4.0, 0.0, 0.0, 3.0])
    g = np.array([0, 0, 0, 1, 1, 1])
    want = []
    for grp in (r[:3], r[3:]):
        want += list((grp - grp.mean()) / (grp.std(ddof=1) + 1e-4))
    np.testing.assert_allclose(algo.advantages(r, g), want, rtol=1e-6)
    np.testing.assert_allclose(algo_of(exp_reward=True).advantages(r, g), -np.exp(-np.array(want)),
                               rtol=1e-6)
    assert [algo.post_update_decay(s) for s in (1, 15, 16, 32)] == [0.0, 0.0, 1.0, 1.0]
    assert algo_of(update_ref_every_iter=0).post_update_decay(16) == 0.0


def test_bad_settings_name_the_key():
    from wfm_jax.algorithms.base import AlgorithmConfigError
    with pytest.raises(AlgorithmConfigError, match="train_on"):
        algo_of(train_on=(0, 9))
    with pytest.raises(AlgorithmConfigError, match="on_policy"):
        algo_of(on_policy=False)


def test_data_term_off_the_rollout_sigma_draws_its_own(rolled):
    """use_rl_sigma_and_noise off: the data term's sigma and noise come from the update key
    (cosmos's lognormal x sqrt(state_t) with the high-sigma share), not the rollout's."""
    algo, params, cond, key, fields = rolled
    x0 = jnp.asarray(np.random.default_rng(3).normal(size=(toy.B, toy.C, toy.H, toy.W)), jnp.float32)
    batch = {name: fields[name] for name in algo.train_fields if name != "data_x0"}
    batch.update(cond=cond, advantage=jnp.zeros((toy.B,), jnp.float32), data_x0=x0)
    on = algo.grads(toy.velocity, toy.Holder(params), params, batch, jax.random.key(0))[1]
    drawn = algo_of(use_rl_sigma_and_noise=False)
    a = drawn.grads(toy.velocity, toy.Holder(params), params, batch, jax.random.key(0))[1]
    b = drawn.grads(toy.velocity, toy.Holder(params), params, batch, jax.random.key(1))[1]
    assert np.isfinite(float(a["data_loss"])) and float(a["data_loss"]) != float(on["data_loss"])
    assert float(a["data_loss"]) != float(b["data_loss"])  # fresh per update key


def test_text_dropout_zeroes_whole_rows_of_text_only():
    """cosmos's conditioner dropout: one Bernoulli draw per row shared by every text entry;
    the video condition passes; the dropped share follows the rate."""
    from wfm_jax.algorithms import wfm_rl as W
    from wfm_jax.algorithms.wfm.algorithm import VIDEO_CONDITION_KEYS
    rows = 4000
    rng = np.random.default_rng(0)
    cond = {"encoder_hidden_states": jnp.asarray(rng.normal(size=(rows, 3, 2)) + 5, jnp.float32),
            "pooled_projections": jnp.asarray(rng.normal(size=(rows, 2)) + 5, jnp.float32),
            "cond_latents": jnp.ones((rows, 2, 1, 1, 1), jnp.float32)}
    out = W.drop_text(cond, jax.random.key(3), 0.2, VIDEO_CONDITION_KEYS)
    text = np.asarray(out["encoder_hidden_states"]).reshape(rows, -1)
    dropped = (text == 0).all(axis=1)
    assert 0.17 < dropped.mean() < 0.23
    np.testing.assert_array_equal((np.asarray(out["pooled_projections"]) == 0).all(axis=1), dropped)
    np.testing.assert_array_equal(text[~dropped], np.asarray(cond["encoder_hidden_states"]).reshape(rows, -1)[~dropped])
    np.testing.assert_array_equal(np.asarray(out["cond_latents"]), 1.0)
    assert W.drop_text(cond, jax.random.key(3), 0.0, VIDEO_CONDITION_KEYS) is cond
    with pytest.raises(ValueError, match="text_dropout_rate"):
        W.WFMRLConfig(text_dropout_rate=1.5)


def test_text_dropout_reaches_the_data_term_only(rolled):
    """rate 1: the data term sees no text (numpy with pooled = 0); the policy and KL terms keep
    it, so they equal the rate-0 step's."""
    _, params, cond, key, fields = rolled
    rng = np.random.default_rng(11)
    adv = np.array([0.5, -0.5, 1.0, -1.0])
    data_x0 = jnp.asarray(rng.normal(size=(toy.B, toy.C, toy.H, toy.W)), jnp.float32)
    metrics = {}
    for rate in (0.0, 1.0):
        algo = algo_of(text_dropout_rate=rate)
        batch = {name: fields[name] for name in algo.train_fields if name != "data_x0"}
        batch.update(cond=cond, advantage=jnp.asarray(adv, jnp.float32), data_x0=data_x0)
        metrics[rate] = algo.grads(toy.velocity, toy.Holder(params), params, batch, jax.random.key(0))[1]
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    pooled = np.asarray(cond["pooled_projections"], np.float64)
    x0_64 = np.asarray(data_x0, np.float64)
    _, kept, _ = loss_np(p64, p64, fields, adv, x0_64, pooled)
    _, none, _ = loss_np(p64, p64, fields, adv, x0_64, np.zeros_like(pooled))
    assert float(metrics[0.0]["data_loss"]) == pytest.approx(kept[:, 2].mean(), rel=2e-4)
    assert float(metrics[1.0]["data_loss"]) == pytest.approx(none[:, 2].mean(), rel=2e-4)
    assert abs(none[:, 2].mean() - kept[:, 2].mean()) > 1e-3 * kept[:, 2].mean()
    for term in ("policy_loss", "kl_loss"):
        assert float(metrics[1.0][term]) == pytest.approx(float(metrics[0.0][term]), rel=1e-6, abs=1e-9)
