"""DDRL on the shared RL loop (issue F acceptance).

Trainer-level wiring against float64 numpy on a toy velocity network: the stored EDM rollout
steps (train_on with a random -1 entry), the training-time recomputed 2ab mean, the policy / KL /
data loss of a stored step (rollout sigma and noise, or drawn ones), data_on_first_only, the
reference copy. The importance ratio is exactly 1 at the first inner epoch. End to end: the tiny
recipe (generated shapes dataset; exp_reward off) raises a brightness reward and compiles nothing
once every kind of work ran; a LoRA variant with every switch runs; a run killed and resumed ends
with the uninterrupted run's metrics and train state, bit for bit.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import _rl_toy as toy
from tests._resume import assert_resumed_run_matches, kill_and_resume, persistent_compile_cache
from wfm_jax.algorithms.advantages import ddrl_advantages
from wfm_jax.algorithms.ddrl import draw_data_sigma
from wfm_jax.algorithms.ddrl.algorithm import DDRL
from wfm_jax.cli import main as wmain
from wfm_jax.config.schema import default_config
from wfm_jax.programs.state import TrainState
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import edm_churn_eta, edm_sigmas

AXES = (1, 2, 3)
N = 6
RECIPE = f"{toy.RECIPES}/tiny_ddrl.py"


def ddrl_config(**overrides):
    c = default_config()
    c.train.train_policy.type = "ddrl"
    c.policy.diffusers.sample.solver = "edm"
    c.policy.diffusers.sample.num_steps = N
    tp = c.train.train_policy
    tp.train_on, tp.kl_beta, tp.data_beta = (0, 2, -1), 0.01, 0.01
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return c


def x0_np(params, x, sigma, pooled):
    """RF-scaled denoiser of the toy net at EDM state x, sigma (B,)."""
    t = (sigma / (1 + sigma))[:, None, None, None]
    v = toy.velocity_np(params, (1 - t) * x, t[:, 0, 0, 0] * 1000.0, pooled)
    return (1 - t) * x - t * v


def mean_np(x_hat, s, sn, x0, x0_prev, s_prev, first):
    """cosmos-rl's deterministic step per row: x0-Euler first, 2ab (res_x0_rk2) after."""
    out = np.empty_like(x_hat)
    for b in range(x_hat.shape[0]):
        if first[b]:
            out[b] = (s[b] - sn[b]) / s[b] * x0[b] + sn[b] / s[b] * x_hat[b]
            continue
        ls, lt, lm = -math.log(s[b]), -math.log(sn[b]), -math.log(s_prev[b])
        dt = lt - ls
        c2 = (lm - ls) / dt
        phi1 = math.expm1(-dt) / -dt
        phi2 = (phi1 - 1) / -dt
        b1, b2 = phi1 - phi2 / c2, phi2 / c2
        out[b] = math.exp(-dt) * x_hat[b] + dt * (b1 * x0[b] + b2 * x0_prev[b])
    return out


def stored_np(f, j):
    keys = ("x_hat", "x_next", "x0_prev", "sigma_hat", "sigma_next", "sigma_prev_hat")
    return [np.asarray(f[k][:, j], np.float64) for k in keys] + [np.asarray(f["step"][:, j]) == 0]


@pytest.fixture(scope="module")
def rollout():
    algo = DDRL.from_recipe(ddrl_config(), 3.0)
    params, cond = toy.params(0), toy.cond(1)
    latents = jax.random.normal(jax.random.key(3), (toy.B, toy.C, toy.H, toy.W))
    data_x0 = jax.random.normal(jax.random.key(5), latents.shape)
    fn = jax.jit(lambda p, lat, c, k, d: algo.rollout(toy.velocity, toy.Holder(p), lat, c, k,
                                                      data_x0=d))
    key = jax.random.key(4)
    return algo, params, cond, latents, data_x0, fn(params, latents, cond, key, data_x0), fn, key


def test_rollout_stores_the_train_on_steps_of_the_edm_trajectory(rollout):
    algo, params, cond, latents, data_x0, f, fn, key = rollout
    k_steps, k_sde = jax.random.split(key)
    full = sample(lambda x, t, c: toy.velocity(params, x, t, c), latents * 200.0,
                  jnp.asarray(edm_sigmas(N), jnp.float32), k_sde, method="edm", cond=cond,
                  return_trajectory=True)
    steps = np.asarray(f["step"][0])
    assert set(steps) >= {0, 2} and len(set(steps)) == 3 and list(steps) == sorted(steps)
    assert (np.asarray(f["step"]) == steps).all() and steps.max() < N
    traj, x0 = np.asarray(full.trajectory), np.asarray(full.x0)
    prev = np.maximum(steps - 1, 0)
    for name, want in (("x_hat", traj[steps]), ("x_next", traj[steps + 1]), ("x0_prev", x0[prev])):
        got = np.swapaxes(np.asarray(f[name]), 0, 1)
        scale = np.abs(want).max(axis=(1, 2, 3, 4), keepdims=True)
        np.testing.assert_allclose(got / scale, want / scale, atol=1e-6, err_msg=name)
    sig = np.asarray(edm_sigmas(N), np.float32)
    np.testing.assert_array_equal(np.asarray(f["sigma_next"][0]), sig[steps + 1])
    np.testing.assert_allclose(np.asarray(f["sigma_hat"][0]),
                               sig[steps] * (1 + edm_churn_eta(1.0, N)), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(f["noise"]), np.asarray(latents))
    np.testing.assert_array_equal(np.asarray(f["data_x0"]), np.asarray(data_x0))
    # the -1 entry: a random step other than 0 and 2, redrawn per rollout
    drawn = {int(i) for s in range(40) for i in algo.draw_steps(jax.random.key(s))} - {0, 2}
    assert drawn == {1, 3, 4, 5}


def test_training_mean_matches_numpy_and_the_sampler(rollout):
    algo, params, cond, latents, _, f, fn, key = rollout
    k_steps, k_sde = jax.random.split(key)
    full = sample(lambda x, t, c: toy.velocity(params, x, t, c), latents * 200.0,
                  jnp.asarray(edm_sigmas(N), jnp.float32), k_sde, method="edm", cond=cond,
                  return_trajectory=True)
    steps = np.asarray(f["step"][0])
    batch = dict(f, cond=cond)
    other = {"w": params["w"] * 1.1, "p": params["p"] - 0.2}
    mean_at = jax.jit(lambda q, b, j: algo.mean_at(toy.velocity, q, b, j), static_argnums=2)
    for j in range(3):
        x_hat, _, x0p, sh, sn, sph, first = stored_np(f, j)
        for p in (params, other):
            want = mean_np(x_hat, sh, sn, x0_np(p, x_hat, sh, cond["pooled_projections"]), x0p,
                           sph, first)
            got = np.asarray(mean_at(p, batch, j))
            scale = np.abs(want).max()
            np.testing.assert_allclose(got / scale, want / scale, atol=2e-6)
        # with the rollout's parameters the recomputed mean is the sampler's (to rounding)
        sampler_mean = np.asarray(full.means[steps[j]])
        scale = np.abs(sampler_mean).max()
        np.testing.assert_allclose(np.asarray(mean_at(params, batch, j)) / scale,
                                   sampler_mean / scale, atol=2e-6)


@pytest.mark.parametrize("rl_sigma", [True, False])
def test_step_loss_matches_numpy(rollout, rl_sigma):
    _, params, cond, _, _, f, _, _ = rollout
    algo = DDRL.from_recipe(
        ddrl_config(**{"train.train_policy.use_rl_sigma_and_noise": rl_sigma}), 3.0)
    j, key = 1, jax.random.key(9)
    ref = {"w": params["w"] * 0.9, "p": params["p"] + 0.1}
    adv = np.array([-0.4, -1.7, -0.9, -6.0], np.float32)
    batch = dict(f, cond=cond, advantage=jnp.asarray(adv))
    x_hat, x_next, x0p, sh, sn, sph, first = stored_np(f, j)
    pooled = cond["pooled_projections"]
    mu = mean_np(x_hat, sh, sn, x0_np(params, x_hat, sh, pooled), x0p, sph, first)
    rng = np.random.default_rng(0)
    eta = edm_churn_eta(1.0, N)
    std = sn[:, None, None, None] * math.sqrt(eta**2 + 2 * eta)
    size = np.array([1e-6, 1e-5, 2e-3, 5e-3])[:, None, None, None]  # inside / outside the clip
    mu_old = mu + size * std * rng.normal(size=mu.shape)
    loss, (m, _) = jax.jit(lambda p, b, o: algo.step_loss(toy.velocity, p, ref, b, j, o, key))(
        params, batch, jnp.asarray(mu_old, jnp.float32))
    log_ratio = (-((x_next - mu) ** 2 - (x_next - mu_old) ** 2)).mean(axis=AXES)
    ratio = np.exp(log_ratio)
    a = adv.astype(np.float64)
    pol = np.maximum(-a * ratio, -np.clip(ratio, 1 - 1e-4, 1 + 1e-4) * a).mean()
    mu_ref = mean_np(x_hat, sh, sn, x0_np(ref, x_hat, sh, pooled), x0p, sph, first)
    kl = ((mu_ref - mu) ** 2).mean()
    x0 = np.asarray(f["data_x0"], np.float64)
    if rl_sigma:
        sigma, eps = sh, np.asarray(f["noise"], np.float64)
    else:
        k_sigma, k_eps = jax.random.split(jax.random.fold_in(key, j))
        sigma = np.asarray(draw_data_sigma(k_sigma, toy.B, math.log(4), 1.2), np.float64)
        eps = np.asarray(jax.random.normal(k_eps, x0.shape), np.float64)
        assert not np.allclose(sigma, sh)
    pred = x0_np(params, x0 + sigma[:, None, None, None] * eps, sigma, pooled)
    data = (((sigma**2 + 1) / sigma**2)[:, None, None, None] * (x0 - pred) ** 2).mean()
    np.testing.assert_allclose(float(m["policy_loss"]), pol, rtol=1e-6)
    # mu and mu_ref are ~100 here (sigma up to 200): their fp32 difference carries ~1e-6
    np.testing.assert_allclose(float(m["kl_loss"]), kl, rtol=2e-6)
    np.testing.assert_allclose(float(m["data_loss"]), data, rtol=1e-6)
    np.testing.assert_allclose(float(loss), 10.0 * (pol + 0.01 * kl + 0.01 * data), rtol=1e-6)
    assert 0 < float(m["clipfrac"]) < 1


def test_log_ratio_norm_std_divides_each_step_by_its_transition_std(rollout):
    """log_ratio_norm "std": the rollout stores each trained step's transition std (0 after the
    last step) and the policy term's log-ratio is divided by it; everything else as "none"."""
    _, params, cond, latents, data_x0, _, _, key = rollout
    algo = DDRL.from_recipe(ddrl_config(**{"train.train_policy.log_ratio_norm": "std",
                                           "train.train_policy.kl_beta": 0.0,
                                           "train.train_policy.data_beta": 0.0,
                                           "train.train_policy.train_on": (0, 2, N - 1)}), 3.0)
    f = jax.jit(lambda p, lat, c, k: algo.rollout(toy.velocity, toy.Holder(p), lat, c, k))(
        params, latents, cond, key)
    eta = edm_churn_eta(1.0, N)
    steps, sn = np.asarray(f["step"]), np.asarray(f["sigma_next"], np.float64)
    want = np.where(steps == N - 1, 0.0, sn * math.sqrt(eta**2 + 2 * eta))
    np.testing.assert_allclose(np.asarray(f["std"]), want, rtol=1e-6)
    assert (want[:, :2] > 0).all()
    adv = np.array([-0.4, -1.7, 0.9, 6.0], np.float32)
    batch = dict(f, cond=cond, advantage=jnp.asarray(adv))
    rng = np.random.default_rng(1)
    for j in range(3):
        x_hat, x_next, x0p, sh, sn_j, sph, first = stored_np(f, j)
        mu = mean_np(x_hat, sh, sn_j, x0_np(params, x_hat, sh, cond["pooled_projections"]), x0p,
                     sph, first)
        std = want[:, j]
        mu_old = mu + np.array([1e-7, 1e-6, 1e-3, 3e-3])[:, None, None, None] * rng.normal(
            size=mu.shape) * max(std.max(), 1e-3)
        loss, (m, _) = jax.jit(lambda p, b, o, jj: algo.step_loss(toy.velocity, p, p, b, jj, o,
                                                                   key), static_argnums=3)(
            params, batch, jnp.asarray(mu_old, jnp.float32), j)
        log_ratio = (-((x_next - mu) ** 2 - (x_next - mu_old) ** 2)).mean(axis=AXES)
        log_ratio = log_ratio / np.where(std > 0, std, 1.0)
        ratio = np.exp(log_ratio)
        a = adv.astype(np.float64)
        pol = np.maximum(-a * ratio, -np.clip(ratio, 1 - 1e-4, 1 + 1e-4) * a).mean()
        # x' and mu are ~100 at step 0 (sigma up to 200): fp32 squares carry ~1e-6 relative
        np.testing.assert_allclose(float(m["policy_loss"]), pol, rtol=1e-5, err_msg=str(j))
        np.testing.assert_allclose(float(m["log_prob_ratio"]), log_ratio.mean(), atol=1e-5,
                                   err_msg=str(j))
        np.testing.assert_allclose(float(loss), 10.0 * pol, rtol=1e-5)
        assert j == 2 or 0 < float(m["clipfrac"]) < 1  # the last step: x' is mu_old, ratio 1


def test_first_inner_epoch_ratio_is_exactly_one_and_data_on_first_only(rollout):
    algo, params, cond, _, _, f, _, _ = rollout
    batch = dict(f, cond=cond, advantage=jnp.asarray([-0.5, -1.5, -1.0, -0.8]))

    def epoch_fn(a):
        @jax.jit
        def epoch(p, old):
            return a.grads(toy.velocity, toy.Holder(p), p, batch, jax.random.key(0), old=old,
                           first=old is None)
        return epoch

    epoch = epoch_fn(algo)
    grads, m, olds = epoch(params, None)
    assert float(m["ratio_abs_dev"]) == 0.0 and float(m["ratio_mean"]) == 1.0
    assert float(m["log_prob_ratio"]) == 0.0
    grads_same, _, kept = epoch(params, olds)
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(olds))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_same)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    moved = jax.tree.map(lambda p, g: p - 0.05 * jnp.sign(g), params, grads)
    assert float(epoch(moved, olds)[1]["ratio_abs_dev"]) > 0
    assert float(epoch(moved, None)[1]["ratio_abs_dev"]) == 0.0
    # data_on_first_only: the data term of the first trained step only, averaged over the 3
    first_only = DDRL.from_recipe(
        ddrl_config(**{"train.train_policy.data_on_first_only": True}), 3.0)
    m_first = epoch_fn(first_only)(params, None)[1]
    step0 = first_only.data_loss_at(toy.velocity, params, batch, 0, jax.random.key(0))
    np.testing.assert_allclose(float(m_first["data_loss"]), float(step0) / 3, rtol=1e-6)
    assert float(m["data_loss"]) != pytest.approx(float(m_first["data_loss"]))


def test_reference_copy_schedule_and_exp_advantages():
    algo = DDRL.from_recipe(ddrl_config(**{"train.train_policy.update_ref_every_iter": 2,
                               "train.train_policy.exp_reward": True}), 3.0)
    assert [algo.post_update_decay(s) for s in range(1, 6)] == [0.0, 1.0, 0.0, 1.0, 0.0]
    params = toy.params(0)
    state = TrainState.create(params, optax.sgd(0.1), jax.random.key(0),
                              aux={"ref": toy.params(1)})
    kept = algo.post_update(state, jnp.float32(0.0))
    copied = algo.post_update(state, jnp.float32(1.0))
    for k in params:
        np.testing.assert_array_equal(np.asarray(kept.aux["ref"][k]), np.asarray(toy.params(1)[k]))
        np.testing.assert_array_equal(np.asarray(copied.aux["ref"][k]), np.asarray(params[k]))
    assert DDRL.moves_reference(DDRL.Config.from_recipe(
        ddrl_config(**{"train.train_policy.update_ref_every_iter": 2})))
    assert not DDRL.moves_reference(DDRL.Config.from_recipe(
        ddrl_config(**{"train.train_policy.update_ref_every_iter": 0})))
    rewards = np.array([0.1, 0.4, 0.2, 0.9, 0.3, 0.3])
    groups = np.array([0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(algo.advantages(rewards, groups),  # unclipped: the loop clips
                                  ddrl_advantages(rewards, groups, exp_reward=True, clip_min=None,
                                                  clip_max=None))
    assert (algo.advantages(rewards, groups) < 0).all()


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("tiny")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes")))


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    with persistent_compile_cache(tmp_path_factory.mktemp("jax_cache")):
        yield


def _argv(dirs, out_dir, *extra):
    # mini_batch 2 per device x the 8 test devices = the whole batch of 16 in one micro-batch.
    # exp_reward off (cosmos-rl's default; the tiny recipe has it on): with A -> -exp(-A) every
    # advantage is negative (mean about -1.65), the update pushes the policy off all its own
    # samples, and the brightness reward fell on 2 of 3 seeds (-0.8, +41, -5.5 standard errors on
    # seeds 0, 1, 2; with data_beta 0 too: -0.7 / -5.1 on seeds 0 / 2). Off, it rose on every seed
    # tried: +6.1, +29.0, +14.6 and +28.4 standard errors on seeds 0, 1, 2, 3 (2026-11-27).
    return ["--config", RECIPE, f"--config.policy.model_name_or_path={dirs[0]}",
            f"--config.train.train_policy.dataset.local_dir={dirs[1]}",
            f"--config.train.output_dir={out_dir}", "--config.train.train_policy.mini_batch=2",
            "--config.train.train_batch_per_replica=16",  # the shapes recipe's 32 since session 47
            "--config.train.train_policy.exp_reward=False",
            *toy.random_model_overrides(5e-3, prompts=False), *extra]


@pytest.fixture(scope="module", autouse=True)
def brightness():
    with toy.brightness_reward() as name:
        yield name


@pytest.fixture(scope="module")
def ddrl_run_compiles(tiny_dirs, compile_cache, tmp_path_factory):
    """The whole tiny recipe, uninterrupted; every 4th step checkpointed (and exported) and
    kept; the programs compiled from step 12 on."""
    out = tmp_path_factory.mktemp("ddrl")
    return out, toy.main_counting_late_compiles(_argv(tiny_dirs, out, "--config.train.ckpt.save_freq=4",
                                                       "--config.train.ckpt.max_keep=5"))


@pytest.fixture(scope="module")
def ddrl_run(ddrl_run_compiles):
    return ddrl_run_compiles[0]


@pytest.mark.slow
def test_tiny_ddrl_reward_rises(ddrl_run):
    m = toy.metrics(ddrl_run)
    assert sorted(m) == list(range(1, 21))
    toy.assert_reward_rises(m)
    for step in m.values():
        assert step["train/first_epoch_ratio_abs_dev"] == 0.0  # exactly, every batch
        # per-group standardised (exp_reward off): each group has rows above and below its mean
        assert step["rollout/advantage_min"] < 0 < step["rollout/advantage_max"]
        assert step["train/data_loss"] > 0 and np.isfinite(step["train/loss"])
    assert "val/reward_mean" in m[10] and "val/reward_mean" in m[20]


@pytest.mark.slow
def test_nothing_compiles_once_every_kind_of_work_ran(ddrl_run_compiles):
    """On the 8-way FSDP mesh, steps 12-20 (validation at 20, checkpoints and exports at 12, 16,
    20; the data items' VAE encodes every step) compile nothing; see tests/_support/compiles.py."""
    assert ddrl_run_compiles[1] == []


@pytest.mark.slow
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_lora_variant_with_every_switch(tiny_dirs, tmp_path):
    """LoRA, KL to a reference copied every step, drawn data sigma / noise, data loss on the
    first trained step only, two inner epochs."""
    out = tmp_path / "variant"
    assert wmain.main(_argv(
        tiny_dirs, out, "--config.train.max_steps=2", "--config.validation.enable=False",
        "--config.policy.lora.enable=True", "--config.policy.lora.r=4",
        "--config.train.train_policy.kl_beta=0.01",
        "--config.train.train_policy.update_ref_every_iter=1",
        "--config.train.train_policy.use_rl_sigma_and_noise=False",
        "--config.train.train_policy.data_on_first_only=True",
        "--config.train.train_policy.train_on=(1, -1)",
        "--config.train.train_policy.mu_iterations=2", "--config.train.optm_lr=3e-2")) == 0
    m = toy.metrics(out)
    for step in (1, 2):
        assert m[step]["train/first_epoch_ratio_abs_dev"] == 0.0
        assert m[step]["train/ratio_abs_dev"] > 0.0  # the second epoch saw moved parameters
        assert m[step]["train/kl_loss"] > 0 and m[step]["train/data_loss"] > 0
    assert (out / "safetensors" / "step_2" / "lora" / "model.safetensors").is_file()


@pytest.mark.slow
def test_resume_after_a_kill_is_bit_identical(ddrl_run, tiny_dirs, compile_cache, tmp_path,
                                              monkeypatch):
    """Killed after step 3 (checkpoint at 2), resumed to 4: the same metrics (data loss
    included: the data items' VAE draws follow the batch) and step-4 state as the
    uninterrupted run (a constant learning rate: its 20 planned steps change nothing), and
    batches 0, 1, 2 then 2, 3 read."""
    out = tmp_path / "resumed"
    argv = _argv(tiny_dirs, out, "--config.train.ckpt.save_freq=2",
                 "--config.train.ckpt.export_safetensors=False",
                 "--config.validation.enable=False")
    read = kill_and_resume(monkeypatch, argv, kill_after=3, resume_to=4)
    assert read == {"killed": [0, 1, 2, 3], "resumed": [2, 3]}  # 3: step 4 began
    assert_resumed_run_matches(out, ddrl_run, 4)


def test_bad_ddrl_settings_stop_with_one_line(tiny_dirs, tmp_path, capsys):
    def run(*extra):
        rc = wmain.main(_argv(tiny_dirs, tmp_path / "out", *extra))
        return rc, capsys.readouterr().err.strip()

    rc, err = run("--config.train.train_policy.train_on=(0, 12)")
    assert rc == 2 and "train_on" in err and "\n" not in err
    rc, err = run("--config.policy.diffusers.sample.solver=dpm2")
    assert rc == 2 and "edm" in err and "\n" not in err
    missing = tmp_path / "no_such_dataset"
    rc, err = run(f"--config.train.train_policy.dataset.local_dir={missing}",
                  "--config.train.train_policy.dataset.build_tiny=False")
    assert rc == 2 and "no_such_dataset" in err and "\n" not in err
