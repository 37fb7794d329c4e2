"""algorithms/wfm_rl.py against float64 numpy written here from cosmos_rl_wfm.md §1: advantages
(unbiased group std, invalid rewards, exp_reward, clamp), every loss term, the combined loss and
its gradient (analytic numpy gradient and finite differences), the per-group draws, the
reference refresh and the config's cosmos-rl defaults."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.algorithms import wfm_rl
from wfm_jax.sampling import edm

SHAPE = (4, 2, 3, 2, 2)  # (B, C, T, H, W)
AXES = (1, 2, 3, 4)
D = int(np.prod(SHAPE[1:]))


def arrays(seed, n, scale=1.0):
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal(SHAPE) for _ in range(n)]


def f32(*xs):
    return [jnp.asarray(x, jnp.float32) for x in xs]


# ----------------------------------------------------------------------------- numpy reference


def np_advantages(r, valid, g, eps=1e-4, exp_reward=False, lo=-5.0, hi=5.0):
    """Spec §1, one group at a time, float64."""
    r = np.atleast_2d(np.asarray(r, np.float64))
    valid = np.broadcast_to(np.atleast_2d(valid), r.shape)
    out = np.zeros_like(r)
    for m in range(r.shape[0]):
        for start in range(0, r.shape[1], g):
            rr, vv = r[m, start:start + g].copy(), valid[m, start:start + g]
            if g == 1:
                out[m, start] = rr[0] if vv[0] else 0.0
                continue
            fill = rr[vv].mean() if vv.any() else 0.0
            rr[~vv] = fill
            out[m, start:start + g] = (rr - rr.mean()) / (np.std(rr, ddof=1) + eps)
    a = out.mean(axis=0)
    if exp_reward:
        a = -np.exp(-a)
    return np.clip(a, lo, hi)


def np_terms(x_next, mu, mu_old, adv, clip, mu_ref=None):
    log_ratio = (-((x_next - mu) ** 2 - (x_next - mu_old) ** 2)).mean(axis=AXES)
    ratio = np.exp(log_ratio)
    pol = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip))
    kl = None if mu_ref is None else ((mu_ref - mu) ** 2).mean(axis=AXES)
    return ratio, log_ratio, pol, kl


def np_data(x0, pred, sigma, sigma_data=1.0):
    s = np.reshape(sigma, (-1,) + (1,) * (x0.ndim - 1))
    return ((s**2 + sigma_data**2) / (s * sigma_data) ** 2 * (x0 - pred) ** 2).mean(axis=AXES)


def np_loss_grad(x_next, mu, mu_old, adv, clip, mu_ref, kl_beta, scale):
    """d loss / d mu_theta, derived by hand: policy branch rule of max(-A r, -A clip(r))."""
    ratio, _, _, _ = np_terms(x_next, mu, mu_old, adv, clip)
    unclipped = -adv * ratio
    clipped = -adv * np.clip(ratio, 1 - clip, 1 + clip)
    inside = (ratio > 1 - clip) & (ratio < 1 + clip)
    d_pol_d_ratio = np.where(inside | (unclipped > clipped), -adv, 0.0)
    col = (slice(None),) + (None,) * 4
    b = x_next.shape[0]
    g_pol = (d_pol_d_ratio * ratio)[col] * 2 * (x_next - mu) / D
    g_kl = -2 * (mu_ref - mu) / D
    return scale / b * (g_pol + kl_beta * g_kl)


# ----------------------------------------------------------------------------- config


def test_config_defaults_are_cosmos_rl_s():
    c = wfm_rl.WFMRLConfig()
    assert (c.sample_steps, c.train_on, c.num_rollout) == (10, tuple(range(8)), 8)
    assert (c.kl_beta, c.data_beta, c.clip_ratio, c.loss_scale) == (0.01, 0.0, 1e-4, 10.0)
    assert (c.update_ref_every_iter, c.use_same_seed) == (16, True)
    assert (c.min_num_conditional_frames, c.max_num_conditional_frames, c.guidance) == (1, 1, 0.0)
    assert (c.solver_option, c.s_churn, c.s_noise, c.s_t_min, c.s_t_max) == ("2ab", 1.0, 1.0, 0.0, math.inf)
    assert (c.adv_clip_min, c.adv_clip_max, c.adv_eps, c.exp_reward) == (-5.0, 5.0, 1e-4, False)
    assert (c.sigma_min, c.sigma_max, c.rho, c.p_mean, c.p_std) == (0.01, 200.0, 7.0, math.log(4.0), 1.2)
    assert c.use_rl_sigma_and_noise
    assert not c.data_on_first_only
    assert c.on_policy
    assert c.micro_steps == 8
    d = wfm_rl.WFMRLConfig.ddrl()
    assert (d.sample_steps, d.train_on) == (20, (0, 2, 4, 6, 8, 10, 12, 14, 16, 18))
    assert (d.kl_beta, d.data_beta) == (0.0, 0.01)
    assert (d.update_ref_every_iter, d.use_same_seed, d.min_num_conditional_frames) == (0, False, 0)
    assert d.micro_steps == 10
    assert d.plan().num_intervals == 20
    assert wfm_rl.WFMRLConfig.ddrl(grad_accum_iter=2).micro_steps == 20
    with pytest.raises(AttributeError):
        c.kl_beta = 0.0


@pytest.mark.parametrize(("bad", "match"), [({"train_on": (0, 0)}, "train_on"),
                                            ({"train_on": (10,)}, "train_on"),
                                            ({"train_on": (-1,) * 11}, "train_on"),
                                            ({"solver_option": "heun"}, "solver_option"),
                                            ({"adv_clip_min": 6.0}, "adv_clip_min"),
                                            ({"min_num_conditional_frames": 2}, "conditional_frames")])
def test_config_rejects_bad_values_in_one_error(bad, match):
    with pytest.raises(ValueError, match=match):
        wfm_rl.WFMRLConfig(**bad)


# ----------------------------------------------------------------------------- advantages


def test_advantages_match_numpy_with_invalid_rewards_and_two_models():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(2, 16)) * 3
    valid = rng.random((2, 16)) > 0.2
    valid[1, 8:] = False  # one group with no valid reward at all -> its A from that model is 0
    got = wfm_rl.group_advantages(r, 8, valid=valid)
    np.testing.assert_allclose(np.asarray(got), np_advantages(r, valid, 8), rtol=1e-5, atol=1e-6)
    got_exp = jax.jit(lambda x: wfm_rl.group_advantages(x, 8, exp_reward=True))(r)
    want_exp = np_advantages(r, True, 8, exp_reward=True)
    np.testing.assert_allclose(np.asarray(got_exp), want_exp, rtol=1e-5, atol=1e-6)


def test_advantages_use_the_unbiased_std():
    r = np.array([0.0, 1.0, 2.0, 3.0])
    got = np.asarray(wfm_rl.group_advantages(r, 4))
    np.testing.assert_allclose(got, (r - 1.5) / (np.sqrt(5 / 3) + 1e-4), rtol=1e-6)


def test_zero_std_group_gets_zero_advantage_and_all_invalid_too():
    r = np.array([2.0] * 8 + [0.5, 1.5] * 4)
    got = np.asarray(wfm_rl.group_advantages(r, 8))
    np.testing.assert_array_equal(got[:8], 0.0)
    assert np.all(np.abs(got[8:]) > 0.9)
    none_valid = np.asarray(wfm_rl.group_advantages(r, 8, valid=np.zeros(16, bool)))
    np.testing.assert_array_equal(none_valid, 0.0)


def test_advantages_clamp_to_plus_minus_five():
    big = np.zeros(32)
    big[0] = 1.0  # one outlier in 32: (31/32) / sqrt(1/32) = 5.48 -> 5
    got = np.asarray(wfm_rl.group_advantages(big, 32))
    assert got[0] == pytest.approx(5.0)
    assert np.all(got[1:] > -5)
    np.testing.assert_allclose(got, np_advantages(big, True, 32), rtol=1e-5)
    # a group of one keeps the raw reward, clamped; invalid -> 0
    solo = np.asarray(wfm_rl.group_advantages([7.0, -9.0, 0.3], 1, valid=[True, True, False]))
    np.testing.assert_allclose(solo, [5.0, -5.0, 0.0])
    # exp_reward: -exp(-A) of a large negative A is clamped at -5
    r = np.array([1.0] * 7 + [0.0])
    exp = np.asarray(wfm_rl.group_advantages(r, 8, exp_reward=True))
    assert exp[-1] == pytest.approx(-5.0)
    np.testing.assert_allclose(exp, np_advantages(r, True, 8, exp_reward=True), rtol=1e-5)
    cfg = wfm_rl.WFMRLConfig(adv_clip_min=-1.0, adv_clip_max=2.0, num_rollout=4)
    np.testing.assert_allclose(np.asarray(wfm_rl.advantages_for(r, cfg)),
                               np_advantages(r, True, 4, lo=-1.0, hi=2.0), rtol=1e-5)
    with pytest.raises(ValueError, match="groups of 3"):
        wfm_rl.group_advantages(r, 3)


# ----------------------------------------------------------------------------- loss terms


def test_each_term_matches_numpy():
    x_next, mu, mu_old, mu_ref, x0, pred = arrays(1, 6, 0.05)
    adv = np.array([1.5, -0.7, 0.0, 3.0])
    ratio, log_ratio = wfm_rl.policy_ratio(*f32(x_next, mu, mu_old))
    w_ratio, w_log, w_pol, w_kl = np_terms(x_next, mu, mu_old, adv, 1e-4, mu_ref)
    np.testing.assert_allclose(np.asarray(log_ratio), w_log, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.asarray(ratio), w_ratio, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(wfm_rl.log_ratio_map(*f32(x_next, mu, mu_old))),
                               -((x_next - mu) ** 2 - (x_next - mu_old) ** 2), atol=1e-7)
    np.testing.assert_allclose(np.asarray(wfm_rl.policy_loss_per_sample(ratio, adv, 1e-4)), w_pol, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(wfm_rl.kl_per_sample(*f32(mu_ref, mu))), w_kl, rtol=1e-5)
    sigma = np.array([0.02, 0.5, 7.0, 150.0])
    np.testing.assert_allclose(np.asarray(wfm_rl.data_loss_per_sample(*f32(x0, pred), sigma)),
                               np_data(x0, pred, sigma), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(wfm_rl.edm_weight(sigma)), 1 + sigma**-2.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(wfm_rl.noisy_data(*f32(x0, pred), sigma)),
                               x0 + sigma[:, None, None, None, None] * pred, rtol=1e-6, atol=1e-7)


def test_data_loss_per_frame_sigma_and_conditioned_frames():
    x0, pred = arrays(2, 2)
    sigma = np.array([[0.5, 1.0, 2.0]] * 4) * np.array([1, 2, 3, 4])[:, None]
    w = 1 + sigma**-2.0
    want = (w[:, None, :, None, None] * (x0 - pred) ** 2).mean(axis=AXES)
    got = wfm_rl.data_loss_per_sample(*f32(x0, pred), sigma)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    mask = wfm_rl.condition_mask(SHAPE, 1)
    assert mask.shape == (4, 1, 3, 2, 2)
    np.testing.assert_array_equal(np.asarray(mask[:, 0, :, 0, 0]), [[1, 0, 0]] * 4)
    got = wfm_rl.data_loss_per_sample(*f32(x0, pred), sigma, condition_mask=mask)
    masked = (w[:, None, :, None, None] * (x0 - pred) ** 2)
    masked[:, :, 0] = 0.0  # conditioned frame: x0_hat = gt, still counted in the mean
    np.testing.assert_allclose(np.asarray(got), masked.mean(axis=AXES), rtol=1e-5)
    with pytest.raises(ValueError, match="per-frame sigma"):
        wfm_rl.data_loss_per_sample(*f32(x0, pred), sigma[:, :2])


def test_combined_loss_matches_numpy_with_kl_data_and_scale():
    cfg = wfm_rl.WFMRLConfig(kl_beta=0.01, data_beta=0.01)
    x_next, mu, mu_old, mu_ref, x0, pred = arrays(3, 6, 0.02)
    adv = np.array([1.0, -2.0, 0.5, -0.1])
    sigma = np.array([3.0, 0.7, 40.0, 0.05])
    data = wfm_rl.data_loss_per_sample(*f32(x0, pred), sigma)
    loss, m = wfm_rl.wfm_rl_loss(*f32(x_next, mu, mu_old), adv, cfg, mu_ref=jnp.asarray(mu_ref, jnp.float32),
                                 data_loss=data)
    ratio, log_ratio, pol, kl = np_terms(x_next, mu, mu_old, adv, 1e-4, mu_ref)
    dat = np_data(x0, pred, sigma)
    raw = pol + 0.01 * kl + 0.01 * dat
    np.testing.assert_allclose(float(loss), raw.mean() * 10 / 8, rtol=1e-5)
    np.testing.assert_allclose(float(m["mse_loss"]), raw.mean(), rtol=1e-5)
    for name, want in (("policy_loss", pol.mean()), ("kl_loss", kl.mean()), ("data_loss", dat.mean()),
                       ("log_prob_ratio", log_ratio.mean()), ("ratio", ratio.mean()),
                       ("clipfrac", np.mean(np.abs(ratio - 1) > 1e-4)), ("advantage", adv.mean())):
        np.testing.assert_allclose(float(m[name]), want, rtol=1e-4, atol=1e-7, err_msg=name)
    # the "GRPO" defaults (data_beta 0) ignore a data loss; kl_beta > 0 needs mu_ref
    grpo = wfm_rl.WFMRLConfig()
    l0, m0 = wfm_rl.wfm_rl_loss(*f32(x_next, mu, mu_old), adv, grpo, mu_ref=jnp.asarray(mu_ref),
                                data_loss=data)
    np.testing.assert_allclose(float(l0), (pol + 0.01 * kl).mean() * 10 / 8, rtol=1e-5)
    assert float(m0["data_loss"]) == 0.0
    with pytest.raises(ValueError, match="mu_ref"):
        wfm_rl.wfm_rl_loss(*f32(x_next, mu, mu_old), adv, grpo)


@pytest.mark.parametrize("clip", [1e-4, 0.05])
def test_loss_gradient_matches_the_analytic_numpy_gradient(clip):
    cfg = wfm_rl.WFMRLConfig(kl_beta=0.3, clip_ratio=clip)
    x_next, mu, mu_ref = arrays(4, 3, 0.1)
    # ratios spread around 1 so rows land inside, above and below the clip range
    mu_old = mu + np.array([0.0, 0.02, -0.02, 0.3])[:, None, None, None, None] * np.sign(x_next - mu)
    adv = np.array([1.3, -0.8, 2.0, -1.1])

    def loss(m):
        return wfm_rl.wfm_rl_loss(jnp.asarray(x_next, jnp.float32), m, jnp.asarray(mu_old, jnp.float32), adv,
                                  cfg, mu_ref=jnp.asarray(mu_ref, jnp.float32))[0]

    got = jax.grad(loss)(jnp.asarray(mu, jnp.float32))
    want = np_loss_grad(x_next, mu, mu_old, adv, clip, mu_ref, 0.3, 10 / 8)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-8)
    assert np.abs(want).max() > 0


# ----------------------------------------------------------------------------- the step with a denoiser


def denoiser(params):
    def net(x_in, t):
        h = jnp.einsum("cd,bd...->bc...", params["w"], x_in)
        return jnp.tanh(h) * params["s"] + t.reshape((-1,) + (1,) * (x_in.ndim - 1))
    return edm.rf_denoiser(net)


def np_denoiser(params, x, sigma):
    t = np.reshape(sigma / (1 + sigma), (-1,) + (1,) * (x.ndim - 1))
    x_in = (1 - t) * x
    f = np.tanh(np.einsum("cd,bd...->bc...", params["w"], x_in)) * params["s"] + t
    return (1 - t) * x - t * f


@pytest.fixture(scope="module")
def rollout():
    rng = np.random.default_rng(5)
    params = {"w": jnp.asarray(rng.standard_normal((2, 2)) * 0.7, jnp.float32), "s": jnp.asarray(1.0)}
    cfg = wfm_rl.WFMRLConfig(sample_steps=4, train_on=(0, 1, 2, 3), num_rollout=4)
    plan = cfg.plan()
    noise = edm.initial_noise(jax.random.key(0), SHAPE, edm.contiguous_group_ids(4, 4))
    traj = jax.jit(lambda p: edm.sample(denoiser(p), noise, plan, jax.random.key(1)))(params)
    return params, cfg, traj


def test_on_policy_ratio_is_one_and_the_step_matches_numpy(rollout):
    params, cfg, traj = rollout
    adv = np.array([1.0, -1.0, 0.5, 2.0])
    step = edm.trajectory_step(traj, 2)

    @jax.jit
    def at(p, k):  # k traced: the first (Euler) step and the last (sample = clean output) too
        st = edm.trajectory_step(traj, k)
        return wfm_rl.rl_step_loss(denoiser(p), st, adv, cfg, micro_step=k, mu_ref=st.mu_old)

    for k in range(4):
        loss, m = at(params, k)
        assert abs(float(m["ratio"]) - 1) < 1e-5
        assert float(m["kl_loss"]) < 1e-10
        np.testing.assert_allclose(float(loss), -adv.mean() * 10 / 4, rtol=1e-4)
    # mu_theta of the 2ab step, recomputed in numpy from the stored record with other weights
    other = {"w": params["w"] * 1.1, "s": jnp.asarray(0.8)}
    p64 = {k: np.asarray(v, np.float64) for k, v in other.items()}
    x_hat, s, t = np.asarray(step.noise_x, np.float64), float(step.sigma), float(step.sigma_next)
    x0 = np_denoiser(p64, x_hat, np.full(4, s))
    lam, lam_t, lam_p = -np.log(s), -np.log(t), -np.log(float(step.sigma_prev))
    h = lam_t - lam
    c2 = (lam_p - lam) / h
    phi1 = np.expm1(-h) / -h
    phi2 = (phi1 - 1) / -h
    mu = np.exp(-h) * x_hat + h * ((phi1 - phi2 / c2) * x0 + phi2 / c2 * np.asarray(step.x0_prev, np.float64))
    sample, mu_old = np.asarray(step.sample, np.float64), np.asarray(step.mu_old, np.float64)
    _, _, pol, kl = np_terms(sample, mu, mu_old, adv, 1e-4, mu_old)
    got, _ = wfm_rl.rl_step_loss(denoiser(other), step, adv, cfg, mu_ref=step.mu_old)
    np.testing.assert_allclose(float(got), (pol + 0.01 * kl).mean() * 10 / 4, rtol=2e-3)


def test_data_term_uses_the_rollout_sigma_and_initial_noise(rollout):
    params, _, traj = rollout
    cfg = wfm_rl.WFMRLConfig(sample_steps=4, train_on=(1, 3), num_rollout=4, kl_beta=0.0, data_beta=0.01,
                             data_on_first_only=True)
    x0 = arrays(6, 1, 0.5)[0]
    step = edm.trajectory_step(traj, 1)
    adv = np.zeros(4)
    _, m = wfm_rl.rl_step_loss(denoiser(params), step, adv, cfg, data_x0=jnp.asarray(x0, jnp.float32),
                               noise=traj.noise)
    p64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
    s = np.full(4, float(step.sigma))
    pred = np_denoiser(p64, x0 + s[:, None, None, None, None] * np.asarray(traj.noise, np.float64), s)
    np.testing.assert_allclose(float(m["data_loss"]), np_data(x0, pred, s).mean(), rtol=1e-4)
    _, later = wfm_rl.rl_step_loss(denoiser(params), step, adv, cfg, micro_step=1,
                                   data_x0=jnp.asarray(x0, jnp.float32), noise=traj.noise)
    assert float(later["data_loss"]) == 0.0  # data_on_first_only
    with pytest.raises(ValueError, match="initial noise"):
        wfm_rl.rl_step_loss(denoiser(params), step, adv, cfg, data_x0=jnp.asarray(x0))
    with pytest.raises(ValueError, match="data_x0"):
        wfm_rl.rl_step_loss(denoiser(params), step, adv, cfg, noise=traj.noise)


def test_step_gradient_matches_finite_differences(rollout):
    params, _, traj = rollout
    # clip_ratio large: the loss is smooth, so central differences apply
    cfg = wfm_rl.WFMRLConfig(sample_steps=4, train_on=(0, 1, 2, 3), num_rollout=4, kl_beta=0.5, data_beta=0.2,
                             clip_ratio=10.0)
    step = edm.trajectory_step(traj, 3)
    x0 = jnp.asarray(arrays(7, 1, 0.5)[0], jnp.float32)
    adv = jnp.asarray([0.7, -1.2, 0.4, 1.9])
    mu_ref = step.mu_old + 0.05

    def f(s):
        p = {"w": params["w"], "s": s}
        return wfm_rl.rl_step_loss(denoiser(p), step, adv, cfg, mu_ref=mu_ref, data_x0=x0,
                                   noise=traj.noise)[0]

    g = float(jax.grad(f)(jnp.asarray(1.0)))
    h = 1e-2
    fd = (float(f(jnp.asarray(1.0 + h))) - float(f(jnp.asarray(1.0 - h)))) / (2 * h)
    assert abs(g) > 1e-4
    np.testing.assert_allclose(g, fd, rtol=2e-2)


# ----------------------------------------------------------------------------- per-group draws, reference


def test_rollout_noise_is_shared_per_group_only_with_use_same_seed():
    key, shape = jax.random.key(2), (16, 2, 3)
    same = np.asarray(wfm_rl.rollout_noise(key, shape, wfm_rl.WFMRLConfig()))
    np.testing.assert_array_equal(same[:8], np.broadcast_to(same[0], (8, 2, 3)))
    np.testing.assert_array_equal(same[8:], np.broadcast_to(same[8], (8, 2, 3)))
    assert np.abs(same[0] - same[8]).min() > 0
    free = np.asarray(wfm_rl.rollout_noise(key, shape, wfm_rl.WFMRLConfig.ddrl()))
    assert len({row.tobytes() for row in free}) == 16
    with pytest.raises(ValueError, match="groups of 8"):
        wfm_rl.rollout_noise(key, (12, 2), wfm_rl.WFMRLConfig())


def test_train_on_draw_keeps_explicit_steps_and_adds_distinct_untrained_ones():
    steps = np.asarray(wfm_rl.draw_train_on(jax.random.key(0), (0, 2, -1, -1, -1), 10))
    assert list(steps[:2]) == [0, 2]
    assert len(set(steps[2:])) == 3
    assert not set(steps[2:]) & {0, 2}
    assert all(0 <= s < 10 for s in steps)
    np.testing.assert_array_equal(np.asarray(wfm_rl.draw_train_on(jax.random.key(0), range(8), 10)), range(8))
    with pytest.raises(ValueError, match="random steps"):
        wfm_rl.draw_train_on(jax.random.key(0), (0, -1, -1), 2)


def test_conditional_frames_are_drawn_in_range():
    keys = jax.random.split(jax.random.key(0), 64)
    one = jax.vmap(lambda k: wfm_rl.draw_num_conditional_frames(k, 1, 1))(keys)
    np.testing.assert_array_equal(np.asarray(one), 1)
    both = np.asarray(jax.vmap(lambda k: wfm_rl.draw_num_conditional_frames(k, 0, 1))(keys))
    assert set(both.tolist()) == {0, 1}


def test_reference_refreshes_every_n_iterations_including_zero():
    due = [bool(wfm_rl.reference_due(i, 16)) for i in range(40)]
    assert [i for i, d in enumerate(due) if d] == [0, 16, 32]
    assert not any(bool(wfm_rl.reference_due(i, 0)) for i in range(20))
    ref, pol = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
    step = jax.jit(lambda r, p, i: wfm_rl.refresh_reference(r, p, i, 16))
    np.testing.assert_array_equal(np.asarray(step(ref, pol, 32)["w"]), 1.0)
    np.testing.assert_array_equal(np.asarray(step(ref, pol, 33)["w"]), 0.0)


def test_data_sigma_draw_matches_numpy_from_the_same_keys():
    cfg = wfm_rl.WFMRLConfig(high_sigma_ratio=0.3)
    key = jax.random.key(11)
    got = np.asarray(wfm_rl.draw_data_sigma(key, 256, cfg), np.float64)
    k_n, k_mask, k_hi = jax.random.split(key, 3)
    z = np.asarray(jax.random.normal(k_n, (256,)), np.float64)
    u_mask = np.asarray(jax.random.uniform(k_mask, (256,)), np.float64)
    u_hi = np.asarray(jax.random.uniform(k_hi, (256,)), np.float64)
    base = np.exp(math.log(4.0) + 1.2 * z) * math.sqrt(24)
    high = np.exp(u_hi * (math.log(1e5) - math.log(200)) + math.log(200))
    np.testing.assert_allclose(got, np.where(u_mask < 0.3, high, base), rtol=1e-5)
    img = np.asarray(wfm_rl.draw_data_sigma(key, 256, cfg, video=False), np.float64)
    np.testing.assert_allclose(img, np.exp(math.log(4.0) + 1.2 * z), rtol=1e-5)
