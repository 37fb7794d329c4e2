"""SFT, NFT, Flow-GRPO and DDRL losses against independent float64 numpy implementations of
spec algorithms.md (random arrays), plus diffusers parity for the SD3 loss weighting."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.training_utils import compute_loss_weighting_for_sd3

from wfm_jax.algorithms import ddrl, grpo, nft, sft
from wfm_jax.sampling import steps as S
from wfm_jax.sampling.schedule import training_table

B, SHAPE = 5, (5, 3, 4, 4)
AXES = (1, 2, 3)


def arrays(seed, n, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal(SHAPE)).astype(np.float32) for _ in range(n)]


def f64(*xs):
    return [np.asarray(x, np.float64) for x in xs]


# ----------------------------------------------------------------------------- SFT


def test_density_transforms_and_table_indices():
    key = jax.random.key(0, impl="rbg")
    u = np.asarray(sft.sample_density(key, 4096, "logit_normal", logit_mean=0.3, logit_std=0.8), np.float64)
    z = np.asarray(jax.random.normal(key, (4096,), jnp.float32), np.float64)
    np.testing.assert_allclose(u, 1 / (1 + np.exp(-(0.3 + 0.8 * z))), rtol=1e-6)
    um = np.asarray(sft.sample_density(key, 4096, "mode", mode_scale=1.29), np.float64)
    uu = np.asarray(jax.random.uniform(key, (4096,), jnp.float32), np.float64)
    np.testing.assert_allclose(um, 1 - uu - 1.29 * (np.cos(np.pi * uu / 2) ** 2 - 1 + uu), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sft.sample_density(key, 4096, "uniform")), uu, rtol=0)
    with pytest.raises(ValueError, match="density scheme"):
        sft.sample_density(key, 4, "lognorm")
    got = np.asarray(sft.table_indices(jnp.asarray([0.0, 0.0005, 0.0015, 0.5, 0.99999, 1.0])))
    np.testing.assert_array_equal(got, [0, 0, 1, 500, 999, 999])


def test_training_timesteps_come_from_the_shifted_table():
    ts_table, sig_table = training_table(3.0)
    idx, ts, sig = sft.sample_training_timesteps(jax.random.key(1, impl="rbg"), 64, ts_table, sig_table)
    idx = np.asarray(idx)
    np.testing.assert_array_equal(np.asarray(ts), ts_table[idx])
    np.testing.assert_array_equal(np.asarray(sig), sig_table[idx])
    # shifted logit-normal: sigma = 3u'/(1 + 2u') with u' = 1 - idx/1000 on the table grid
    u_prime = (1000 - idx) / 1000.0
    np.testing.assert_allclose(np.asarray(sig), 3 * u_prime / (1 + 2 * u_prime), rtol=1e-6)


@pytest.mark.parametrize("scheme", ["sigma_sqrt", "cosmap", "logit_normal", "none", "mode"])
def test_loss_weighting_matches_diffusers(scheme):
    sigmas = np.linspace(0.05, 1.0, 11, dtype=np.float32)
    want = compute_loss_weighting_for_sd3(scheme, torch.from_numpy(sigmas)).numpy()
    np.testing.assert_allclose(np.asarray(sft.loss_weighting(scheme, sigmas)), want, rtol=1e-6)


@pytest.mark.parametrize("weighting", ["none", "sigma_sqrt", "cosmap"])
def test_flow_matching_loss_matches_numpy(weighting):
    v, noise, x0 = arrays(2, 3)
    sig = np.linspace(0.1, 0.95, B).astype(np.float32)
    rew = np.array([1, 0, 0, 1, 0], np.float32)
    v64, n64, x64, s64 = f64(v, noise, x0, sig)
    w = {"none": np.ones(B), "sigma_sqrt": s64**-2, "cosmap": 2 / (np.pi * (1 - 2 * s64 + 2 * s64**2))}[weighting]
    per = (w[:, None, None, None] * (v64 - (n64 - x64)) ** 2).mean(axis=AXES)
    got = sft.flow_matching_loss(jnp.asarray(v), jnp.asarray(noise), jnp.asarray(x0), sig, weighting)
    np.testing.assert_allclose(float(got), per.mean(), rtol=1e-6)
    got_w = sft.flow_matching_loss(jnp.asarray(v), jnp.asarray(noise), jnp.asarray(x0), sig, weighting, sample_weight=rew)
    np.testing.assert_allclose(float(got_w), (per * rew).mean(), rtol=1e-6)
    xt = np.asarray(sft.noisy_latents(jnp.asarray(x0), jnp.asarray(noise), sig))
    np.testing.assert_allclose(xt, (1 - s64[:, None, None, None]) * x64 + s64[:, None, None, None] * n64, atol=1e-6)
    with pytest.raises(ValueError, match="weighting scheme"):
        sft.loss_weighting("sigma", sig)


# ----------------------------------------------------------------------------- NFT


def _nft_numpy(v_th, v_old, v_ref, x0, xt, t, adv, beta, c=5.0, kl_w=1e-4):
    v_th, v_old, v_ref, x0, xt, t, adv = f64(v_th, v_old, v_ref, x0, xt, t, adv)
    tt = t[:, None, None, None]
    r = np.clip(np.clip(adv, -c, c) / c / 2 + 0.5, 0, 1)
    out = {}
    losses, grads = [], []
    for sign, v in ((+1, beta * v_th + (1 - beta) * v_old), (-1, (1 + beta) * v_old - beta * v_th)):
        err = xt - tt * v - x0
        w = np.maximum(np.abs(err).mean(axis=AXES), 1e-5)
        losses.append((err**2).mean(axis=AXES) / w)
        # d/dv_theta of mean(err^2)/w with w held constant: dv/dv_theta = +-beta
        grads.append(2 * err * (-tt) * (sign * beta) / (err[0].size * w[:, None, None, None]))
    per = r * losses[0] / beta + (1 - r) * losses[1] / beta
    out["policy_loss"] = (per * c).mean()
    out["kl_loss"] = ((v_th - v_ref) ** 2).mean(axis=AXES).mean()
    out["loss"] = out["policy_loss"] + kl_w * out["kl_loss"]
    out["old_deviation"] = ((v_th - v_old) ** 2).mean()
    out["x0_norm"] = (x0**2).mean()
    out["unweighted_policy_loss"] = per.mean()
    rr = r[:, None, None, None]
    grad = c / len(r) * (rr * grads[0] + (1 - rr) * grads[1]) / beta + kl_w * 2 * (v_th - v_ref) / v_th.size
    return out, grad


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_matches_numpy(beta):
    v_th, v_old, v_ref, x0, noise = arrays(3, 5)
    v_old = v_th + 0.1 * v_old  # an old policy near the current one
    t = np.array([0.96, 0.7, 0.45, 0.2, 0.05], np.float32)
    xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
    # sample 4 is predicted exactly by both policies: the 1e-5 weight floor is active there
    v_th[4] = v_old[4] = noise[4] - x0[4]
    adv = np.array([7.0, 1.2, 0.0, -2.5, -9.0], np.float32)
    want, want_grad = _nft_numpy(v_th, v_old, v_ref, x0, xt, t, adv, beta)

    def loss_fn(v):
        return nft.nft_loss(v, jnp.asarray(v_old), jnp.asarray(x0), jnp.asarray(xt), t, adv, jnp.asarray(v_ref), beta=beta)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(jnp.asarray(v_th))
    np.testing.assert_allclose(float(loss), want["loss"], rtol=1e-6)
    for k in ("policy_loss", "kl_loss", "old_deviation", "x0_norm", "unweighted_policy_loss"):
        np.testing.assert_allclose(float(metrics[k]), want[k], rtol=1e-6, err_msg=k)
    np.testing.assert_allclose(np.asarray(grad)[:4], want_grad[:4], rtol=1e-5, atol=1e-7)
    # sample 4's error is fp32 rounding (~1e-8) divided by the 1e-5 floor: compare absolutely
    np.testing.assert_allclose(np.asarray(grad)[4], want_grad[4], atol=5e-5)
    # no KL term without a reference velocity
    loss_no_ref, m = nft.nft_loss(jnp.asarray(v_th), jnp.asarray(v_old), jnp.asarray(x0), jnp.asarray(xt), t, adv, beta=beta)
    np.testing.assert_allclose(float(loss_no_ref), want["policy_loss"], rtol=1e-6)
    assert float(m["kl_loss"]) == 0.0


# ----------------------------------------------------------------------------- Flow-GRPO


def test_grpo_loss_matches_numpy():
    rng = np.random.default_rng(4)
    old = rng.normal(-1.0, 0.3, B).astype(np.float32)
    new = (old + np.array([0.0, 5e-5, -3e-4, 2e-4, -2e-5])).astype(np.float32)  # inside and outside the clip
    adv = np.array([1.5, -0.7, 6.0, -8.0, 0.3], np.float32)
    mean, ref_mean = arrays(5, 2)
    std_dev_t = np.float32(0.37)
    eps, beta = 1e-4, 0.04
    loss, m = grpo.grpo_loss(jnp.asarray(new), old, adv, clip_range=eps, kl_beta=beta, mean=jnp.asarray(mean), ref_mean=jnp.asarray(ref_mean), std_dev_t=std_dev_t)
    n64, o64, a64, mu, mr = f64(new, old, adv, mean, ref_mean)
    a = np.clip(a64, -5, 5)
    ratio = np.exp(n64 - o64)
    pol = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps, 1 + eps)).mean()
    kl = (((mu - mr) ** 2).mean(axis=AXES) / (2 * float(std_dev_t) ** 2)).mean()
    # fp32 log-probs near -1 are quantised at ~1e-7, so the ratio is too: absolute 1e-6 bar
    np.testing.assert_allclose(float(m["policy_loss"]), pol, rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(m["kl_loss"]), kl, rtol=1e-6)
    np.testing.assert_allclose(float(loss), pol + beta * kl, rtol=0, atol=1e-6)
    assert float(m["clipfrac"]) == pytest.approx(np.mean(np.abs(ratio - 1) > eps))
    np.testing.assert_allclose(float(m["approx_kl"]), 0.5 * np.mean((n64 - o64) ** 2), rtol=1e-4)
    # per-sample std_dev_t (as sde_mean returns for per-sample sigmas)
    std_b = np.linspace(0.2, 0.9, B).astype(np.float32)
    kl_b = grpo.closed_form_kl(jnp.asarray(mean), jnp.asarray(ref_mean), std_b)
    np.testing.assert_allclose(np.asarray(kl_b), ((mu - mr) ** 2).mean(axis=AXES) / (2 * std_b.astype(np.float64) ** 2), rtol=1e-6)
    # the gradient flows through log_prob only
    g = jax.grad(lambda lp: grpo.grpo_loss(lp, old, adv, clip_range=eps)[0])(jnp.asarray(new))
    inside = np.abs(ratio - 1) <= eps
    want_g = np.where(inside | (-a * ratio >= -a * np.clip(ratio, 1 - eps, 1 + eps)), -a * ratio / B, 0.0)
    np.testing.assert_allclose(np.asarray(g), want_g, rtol=1e-5, atol=1e-9)
    with pytest.raises(ValueError, match="kl_beta"):
        grpo.grpo_loss(jnp.asarray(new), old, adv, kl_beta=0.1)


# ----------------------------------------------------------------------------- DDRL


def test_ddrl_loss_matches_numpy():
    x_next, mu_old, noise, x0, eps_, pred = arrays(6, 6)
    mu_th = mu_old + 0.01 * noise
    mu_ref = mu_old - 0.02 * noise
    adv = np.array([-0.2, -1.5, -5.0, -0.9, -0.05], np.float32)
    sigma = np.array([0.02, 0.5, 3.0, 40.0, 150.0], np.float32)
    data = ddrl.ddrl_data_loss(jnp.asarray(x0), jnp.asarray(pred), sigma)
    loss, m = ddrl.ddrl_loss(jnp.asarray(x_next), jnp.asarray(mu_th), jnp.asarray(mu_old), adv, clip_ratio=1e-4, kl_beta=0.01, mean_ref=jnp.asarray(mu_ref), data_beta=0.01, data_loss=data, loss_scale=10.0)
    xn, mt, mo, mr, x064, p64, a64, s64 = f64(x_next, mu_th, mu_old, mu_ref, x0, pred, adv, sigma)
    log_ratio = (-((xn - mt) ** 2 - (xn - mo) ** 2)).mean(axis=AXES)
    ratio = np.exp(log_ratio)
    pol = np.maximum(-a64 * ratio, -np.clip(ratio, 1 - 1e-4, 1 + 1e-4) * a64).mean()
    kl = ((mr - mt) ** 2).mean()
    w = ((s64**2 + 1) / s64**2)[:, None, None, None]
    dl = (w * (x064 - p64) ** 2).mean()
    np.testing.assert_allclose(float(m["policy_loss"]), pol, rtol=1e-6)
    np.testing.assert_allclose(float(m["kl_loss"]), kl, rtol=1e-6)
    np.testing.assert_allclose(float(m["data_loss"]), dl, rtol=1e-6)
    np.testing.assert_allclose(float(loss), 10.0 * (pol + 0.01 * kl + 0.01 * dl), rtol=1e-6)
    np.testing.assert_allclose(float(m["log_prob_ratio"]), log_ratio.mean(), atol=1e-7)  # difference of squares


def test_ddrl_data_loss_is_the_rf_velocity_loss():
    """x_sigma = x0 + sigma eps fed to an RF velocity net: EDM weight (1+s^2)/s^2 on (x0 - x0_hat)^2
    equals ((1-t)^2 + t^2) (v_hat - (eps - x0))^2 with t = sigma/(1+sigma) (spec §4)."""
    x0, eps_, v_hat = arrays(7, 3)
    sigma = np.array([0.05, 0.8, 2.0, 11.0, 90.0], np.float32)
    x_sig = ddrl.edm_noisy(jnp.asarray(x0), jnp.asarray(eps_), sigma)
    x0_hat = S.edm_x0(x_sig, jnp.asarray(v_hat), sigma)
    got = float(ddrl.ddrl_data_loss(jnp.asarray(x0), x0_hat, sigma))
    x064, e64, v64, s64 = f64(x0, eps_, v_hat, sigma)
    t = (s64 / (1 + s64))[:, None, None, None]
    want = (((1 - t) ** 2 + t**2) * (v64 - (e64 - x064)) ** 2).mean()
    np.testing.assert_allclose(got, want, rtol=2e-5)
    # the network input is (1 - t) x_sigma = (1 - t) x0 + t eps, the RF interpolant
    x_in, tt = S.edm_model_input(x_sig, sigma)
    np.testing.assert_allclose(np.asarray(x_in), (1 - t) * x064 + t * e64, atol=2e-5)
    np.testing.assert_allclose(np.asarray(tt), t.reshape(-1), rtol=1e-6)


def test_draw_data_sigma_is_lognormal():
    key = jax.random.key(3, impl="rbg")
    sig = np.asarray(ddrl.draw_data_sigma(key, 4096, math.log(4.0), 1.2), np.float64)
    z = np.asarray(jax.random.normal(key, (4096,), jnp.float32), np.float64)
    np.testing.assert_allclose(sig, np.exp(math.log(4.0) + 1.2 * z), rtol=1e-5)


def test_nft_train_timesteps_are_per_sample_permutations():
    ts = np.linspace(1000.0, 89.0, 10).astype(np.float32)
    assert nft.trained_step_count(10, 0.99) == 9
    got = np.asarray(nft.train_timesteps(jax.random.key(5, impl="rbg"), ts, 6, 9))
    assert got.shape == (6, 9)
    for row in got:
        assert len(set(row.tolist())) == 9 and set(row.tolist()) <= set(ts.tolist())
    assert len({tuple(r) for r in got.tolist()}) > 1  # samples get different orders
