"""Flow-GRPO on the shared RL loop (issue F acceptance).

Trainer-level wiring against float64 numpy on a toy velocity network: the stored trajectory and
log-probs of an SDE rollout with CFG, the training-time recomputed mean / log-prob / PPO loss /
closed-form KL of a stored step, the gradient with the unconditional branch detached, the Fast
window with the CPS step. The importance ratio is exactly 1 at the first inner epoch. End to end:
the tiny recipe raises a brightness reward and compiles nothing once every kind of work ran; the
Fast variant with two inner epochs and LoRA runs; a run killed and resumed ends with the
uninterrupted run's metrics and train state, bit for bit.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _rl_toy as toy
from tests._resume import assert_resumed_run_matches, kill_and_resume, persistent_compile_cache
from wfm_jax.algorithms.grpo.algorithm import GRPO
from wfm_jax.cli import main as wmain
from wfm_jax.config.schema import default_config
from wfm_jax.sampling.samplers import draw_window_start, sample
from wfm_jax.sampling.schedule import flow_sigmas

AXES = (1, 2, 3)
RECIPE = f"{toy.RECIPES}/tiny_grpo.py"


def grpo_config(**overrides):
    c = default_config()
    c.train.train_policy.type = "grpo"
    s = c.policy.diffusers.sample
    s.solver, s.num_steps, s.guidance_scale, s.noise_level = "sde", 6, 4.5, 0.7
    c.train.train_policy.kl_beta = 0.04
    c.train.train_policy.clip_range = 1e-4
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    return c


def cfg_velocity_np(params, x, sigma, cond, uncond, g):
    t = np.broadcast_to(np.asarray(sigma, np.float64) * 1000.0, (x.shape[0],))
    v_c = toy.velocity_np(params, x, t, cond["pooled_projections"])
    if uncond is None:
        return v_c
    v_u = toy.velocity_np(params, x, t, uncond["pooled_projections"])
    return v_u + g * (v_c - v_u)


def sde_np(x, v, s, sn, a, sigma1):
    """(mean, step std, std_dev_t) of the Flow-GRPO SDE step, spec §2."""
    s_t = sigma1 if s == 1 else s
    std_dev_t = a * math.sqrt(s / (1 - s_t))
    dt = sn - s
    mean = x * (1 + std_dev_t**2 / (2 * s) * dt) + v * (1 + std_dev_t**2 * (1 - s) / (2 * s)) * dt
    return mean, std_dev_t * math.sqrt(-dt), std_dev_t


def gauss_lp_np(x, mean, std):
    lp = -((x - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return lp.mean(axis=AXES)


@pytest.fixture(scope="module")
def cfg_rollout():
    """An SDE rollout with CFG 4.5 of the toy network, 6 steps, the first 5 trained."""
    algo = GRPO.from_recipe(grpo_config(), 3.0)
    params, cond, uncond = toy.params(0), toy.cond(1), toy.cond(2)
    latents = jax.random.normal(jax.random.key(3), (toy.B, toy.C, toy.H, toy.W))
    fields = jax.jit(lambda p, lat, c, u, k: algo.rollout(toy.velocity, toy.Holder(p), lat, c, k,
                                                          uncond=u))(params, latents, cond, uncond,
                                                                     jax.random.key(4))
    return algo, params, cond, uncond, latents, fields


def test_rollout_stores_the_trained_steps_and_their_log_probs(cfg_rollout):
    algo, params, cond, uncond, latents, f = cfg_rollout
    sigmas = flow_sigmas(6, 3.0)[0].astype(np.float64)
    assert algo.num_train == 5 and f["traj"].shape == (toy.B, 6, toy.C, toy.H, toy.W)
    np.testing.assert_array_equal(np.asarray(f["traj"][:, 0]), np.asarray(latents))
    np.testing.assert_array_equal(np.asarray(f["sigmas"]),
                                  np.broadcast_to(sigmas[:6], (toy.B, 6)).astype(np.float32))
    traj = np.asarray(f["traj"], np.float64)
    for j in range(5):
        x, x_next = traj[:, j], traj[:, j + 1]
        v = cfg_velocity_np(params, x, sigmas[j], cond, uncond, 4.5)
        mean, std, _ = sde_np(x, v, sigmas[j], sigmas[j + 1], 0.7, sigmas[1])
        z = (x_next - mean) / std  # the stored next state is the mean plus std times N(0, 1)
        assert np.abs(z).max() < 6 and 0.6 < z.std() < 1.4, (j, z.std())
        np.testing.assert_allclose(np.asarray(f["log_prob"][:, j]), gauss_lp_np(x_next, mean, std),
                                   rtol=1e-6, atol=1e-6)
    assert np.isfinite(np.asarray(f["final"])).all()


def test_training_step_loss_kl_and_detached_uncond_gradient_match_numpy(cfg_rollout):
    algo, params, cond, uncond, _, f = cfg_rollout
    j, g, beta, eps = 2, 4.5, 0.04, 1e-4
    sigmas = flow_sigmas(6, 3.0)[0].astype(np.float64)
    ref = {"w": params["w"] * 0.8, "p": params["p"] + 0.1}
    adv = np.array([1.3, -0.6, 7.0, -2.0], np.float32)  # 7 is clipped to 5
    x, x_next = (np.asarray(f["traj"][:, k], np.float64) for k in (j, j + 1))
    timesteps = np.full(toy.B, sigmas[j] * 1000)
    v_u0 = toy.velocity_np(params, x, timesteps, uncond["pooled_projections"])

    def loss_np(p, old):
        """Numpy loss with the unconditional velocity frozen at the starting parameters."""
        v_c = toy.velocity_np(p, x, timesteps, cond["pooled_projections"])
        mean, std, std_dev_t = sde_np(x, v_u0 + g * (v_c - v_u0), sigmas[j], sigmas[j + 1], 0.7,
                                      sigmas[1])
        lp = gauss_lp_np(x_next, mean, std)
        ratio = np.exp(lp - old)
        a = np.clip(adv.astype(np.float64), -5, 5)
        pol = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps, 1 + eps)).mean()
        v_ref = cfg_velocity_np(ref, x, sigmas[j], cond, uncond, g)
        mean_ref = sde_np(x, v_ref, sigmas[j], sigmas[j + 1], 0.7, sigmas[1])[0]
        kl = (((mean - mean_ref) ** 2).mean(axis=AXES) / (2 * std_dev_t**2)).mean()
        return pol + beta * kl, pol, kl, lp

    lp0 = loss_np(params, 0.0)[3]
    old = (lp0 + np.array([0.0, 5e-5, -3e-4, 2e-4])).astype(np.float32)  # inside / outside the clip
    batch = {"traj": f["traj"], "sigmas": f["sigmas"], "log_prob": f["log_prob"], "cond": cond,
             "advantage": jnp.asarray(adv)}

    def loss_jax(p):
        return algo.step_loss(toy.velocity, p, ref, batch, j, jnp.asarray(old), uncond)

    (loss, (m, lp)), grads = jax.jit(jax.value_and_grad(loss_jax, has_aux=True))(params)
    want, pol, kl, _ = loss_np(params, old.astype(np.float64))
    np.testing.assert_allclose(np.asarray(lp), lp0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(m["policy_loss"]), pol, rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(m["kl_loss"]), kl, rtol=1e-6)
    np.testing.assert_allclose(float(loss), want, rtol=0, atol=1e-6)
    # gradient: central differences of the numpy loss whose uncond branch is a constant
    h = 1e-5
    for name in ("w", "p"):
        base = np.asarray(params[name], np.float64)
        fd = np.zeros(base.shape)
        for idx in np.ndindex(base.shape):
            up, down = base.copy(), base.copy()
            up[idx] += h
            down[idx] -= h
            fd[idx] = (loss_np(dict(params, **{name: up}), old)[0]
                       - loss_np(dict(params, **{name: down}), old)[0]) / (2 * h)
        np.testing.assert_allclose(np.asarray(grads[name]), fd, rtol=2e-3, atol=1e-6)


def test_first_inner_epoch_ratio_is_exactly_one(cfg_rollout):
    algo, params, cond, uncond, _, f = cfg_rollout
    ref = {"w": params["w"] * 0.8, "p": params["p"]}
    batch = {"traj": f["traj"], "sigmas": f["sigmas"], "log_prob": f["log_prob"], "cond": cond,
             "advantage": jnp.asarray([1.0, -1.0, 0.5, -0.5])}

    @jax.jit
    def epoch(p, old):
        first = old is None
        return algo.grads(toy.velocity, toy.Holder(p), ref, batch, jax.random.key(0), old=old,
                          first=first, uncond=uncond)

    grads, m, olds = epoch(params, None)
    assert float(m["ratio_abs_dev"]) == 0.0 and float(m["ratio_mean"]) == 1.0
    assert float(m["approx_kl"]) == 0.0
    # the stored "old" log-probs are the training forward's; the sampler's agree to rounding
    np.testing.assert_allclose(np.asarray(olds), np.asarray(f["log_prob"]), rtol=0, atol=1e-5)
    assert float(m["rollout_log_prob_gap"]) < 1e-5
    # a later epoch at the same parameters reproduces the first epoch's gradient
    grads_same, _, kept = epoch(params, olds)
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(olds))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_same)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-9)
    # after the parameters moved, the ratio moves; a new first epoch is exactly 1 again
    moved = jax.tree.map(lambda p, g: p - 0.05 * jnp.sign(g), params, grads)
    assert float(epoch(moved, olds)[1]["ratio_abs_dev"]) > 1e-4
    assert float(epoch(moved, None)[1]["ratio_abs_dev"]) == 0.0


def test_fast_window_trains_only_the_cps_window():
    cfg = grpo_config(**{"policy.diffusers.sample.solver": "cps",
                         "policy.diffusers.sample.sde_window_size": 2,
                         "policy.diffusers.sample.sde_window_range": (0, 6),
                         "policy.diffusers.sample.noise_level": 0.8,
                         "policy.diffusers.sample.guidance_scale": 1.0,
                         "train.train_policy.kl_beta": 0.0})
    algo = GRPO.from_recipe(cfg, 3.0)
    assert algo.num_train == 2
    params, cond = toy.params(5), toy.cond(6)
    latents = jax.random.normal(jax.random.key(7), (toy.B, toy.C, toy.H, toy.W))
    sigmas = flow_sigmas(6, 3.0)[0]
    rollout = jax.jit(lambda p, lat, c, k: algo.rollout(toy.velocity, toy.Holder(p), lat, c, k))
    starts = set()
    for seed in range(4):
        key = jax.random.key(10 + seed)
        f = rollout(params, latents, cond, key)
        k_window, k_sde = jax.random.split(key)
        start = int(draw_window_start(k_window, (0, 6), 2))
        starts.add(start)
        full = sample(lambda x, t, c: toy.velocity(params, x, t, c), latents, sigmas, k_sde,
                      method="cps", cond=cond, noise_level=0.8, sde_window_start=start,
                      sde_window_size=2, return_trajectory=True)
        np.testing.assert_allclose(np.asarray(f["traj"]), np.swapaxes(
            np.asarray(full.trajectory[start:start + 3]), 0, 1), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(f["sigmas"][0]), sigmas[start:start + 3])
        # the training recomputation of both window steps: CPS mean and pseudo log-prob
        traj, s64 = np.asarray(f["traj"], np.float64), sigmas.astype(np.float64)
        for j in range(2):
            s, sn = s64[start + j], s64[start + j + 1]
            x = traj[:, j]
            v = toy.velocity_np(params, x, np.full(toy.B, s * 1000), cond["pooled_projections"])
            std = sn * math.sin(0.8 * math.pi / 2)
            mean = (1 - sn) * (x - s * v) + math.sqrt(sn**2 - std**2) * (x + (1 - s) * v)
            want = -((traj[:, j + 1] - mean) ** 2).mean(axis=AXES)
            np.testing.assert_allclose(np.asarray(f["log_prob"][:, j]), want, rtol=1e-6, atol=1e-7)
            batch = {"traj": f["traj"], "sigmas": f["sigmas"], "log_prob": f["log_prob"],
                     "cond": cond, "advantage": jnp.ones((toy.B,))}
            lp = algo.step_loss(toy.velocity, params, params, batch, j, None)[1][1]
            np.testing.assert_allclose(np.asarray(lp), want, rtol=1e-6, atol=1e-7)
    assert len(starts) > 1  # the window start is drawn, not fixed


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    with persistent_compile_cache(tmp_path_factory.mktemp("jax_cache")):
        yield


def _argv(tiny_dir, out_dir, *extra):
    # mini_batch 2 per device x the 8 test devices = the whole batch of 16 in one micro-batch
    # (reward rise measured at 8.1, 24.7 and 23.9 standard errors on seeds 0, 1, 2; on the JPEG
    # reward at 32x32 it was 17.5, 25.6 and 15.8, in twice the time)
    return ["--config", RECIPE, f"--config.policy.model_name_or_path={tiny_dir}",
            f"--config.train.output_dir={out_dir}", "--config.train.train_policy.mini_batch=2",
            *toy.random_model_overrides(3e-3),
            "--config.train.train_policy.kl_beta=0.0",  # as measured (the shapes recipe has 0.04)
            "--config.policy.diffusers.sample.guidance_scale=4.5", *extra]  # CFG path as measured


@pytest.fixture(scope="module", autouse=True)
def brightness():
    with toy.brightness_reward() as name:
        yield name


@pytest.fixture(scope="module")
def grpo_run_compiles(tiny_dir, compile_cache, tmp_path_factory):
    """The whole tiny recipe, uninterrupted; every 4th step checkpointed (and exported) and
    kept; the programs compiled from step 12 on."""
    out = tmp_path_factory.mktemp("grpo")
    return out, toy.main_counting_late_compiles(_argv(tiny_dir, out, "--config.train.ckpt.save_freq=4",
                                                       "--config.train.ckpt.max_keep=5"))


@pytest.fixture(scope="module")
def grpo_run(grpo_run_compiles):
    return grpo_run_compiles[0]


@pytest.mark.slow
def test_tiny_grpo_reward_rises(grpo_run):
    m = toy.metrics(grpo_run)
    assert sorted(m) == list(range(1, 21))
    toy.assert_reward_rises(m)
    for step in m.values():
        assert step["train/first_epoch_ratio_abs_dev"] == 0.0  # exactly, every batch
        for key in ("train/loss", "train/policy_loss", "train/grad_norm",
                    "train/rollout_log_prob_gap", "rollout/advantage_mean"):
            assert np.isfinite(step[key]), key
    assert "val/reward_mean" in m[10] and "val/reward_mean" in m[20]


@pytest.mark.slow
def test_nothing_compiles_once_every_kind_of_work_ran(grpo_run_compiles):
    """On the 8-way FSDP mesh: the state an update returns is laid out as it went in (every
    train jit has explicit shardings), so steps 12-20 (validation at 20, checkpoints and exports
    at 12, 16, 20) compile nothing; see tests/_support/compiles.py."""
    assert grpo_run_compiles[1] == []


@pytest.mark.slow
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_fast_variant_lora_two_inner_epochs(tiny_dir, tmp_path):
    """Window of 2 CPS steps (one may end at sigma 0), two optimizer steps per batch, LoRA
    with a KL term."""
    out = tmp_path / "fast"
    assert wmain.main(_argv(
        tiny_dir, out, "--config.train.max_steps=2", "--config.validation.enable=False",
        "--config.policy.lora.enable=True", "--config.policy.lora.r=4",
        "--config.policy.diffusers.sample.solver=cps",
        "--config.policy.diffusers.sample.noise_level=0.8",
        "--config.policy.diffusers.sample.num_steps=6",
        "--config.policy.diffusers.sample.sde_window_size=2",
        "--config.policy.diffusers.sample.sde_window_range=(0, 6)",
        "--config.policy.diffusers.sample.guidance_scale=1.0",
        "--config.train.train_policy.kl_beta=0.01",
        "--config.train.train_policy.mu_iterations=2", "--config.train.optm_lr=3e-2")) == 0
    m = toy.metrics(out)
    for step in (1, 2):
        assert m[step]["train/first_epoch_ratio_abs_dev"] == 0.0
        assert m[step]["train/ratio_abs_dev"] > 0.0  # the second epoch saw moved parameters
        assert np.isfinite(m[step]["train/kl_loss"])
    assert m[2]["train/kl_loss"] > 0  # the adapters moved the policy off the base model
    assert (out / "safetensors" / "step_2" / "lora" / "model.safetensors").is_file()


@pytest.mark.slow
def test_resume_after_a_kill_is_bit_identical(grpo_run, tiny_dir, compile_cache, tmp_path,
                                              monkeypatch):
    """Killed after step 3 (checkpoint at 2), resumed to 4: the same metrics and step-4 state
    as the uninterrupted run (a constant learning rate: its 20 planned steps change nothing),
    and batches 0, 1, 2 then 2, 3 read."""
    out = tmp_path / "resumed"
    argv = _argv(tiny_dir, out, "--config.train.ckpt.save_freq=2",
                 "--config.train.ckpt.export_safetensors=False",
                 "--config.validation.enable=False")
    read = kill_and_resume(monkeypatch, argv, kill_after=3, resume_to=4)
    assert read == {"killed": [0, 1, 2, 3], "resumed": [2, 3]}  # 3: step 4 began
    assert_resumed_run_matches(out, grpo_run, 4)


def test_bad_grpo_settings_stop_with_one_line(tiny_dir, tmp_path, capsys):
    def run(*extra):
        rc = wmain.main(_argv(tiny_dir, tmp_path / "out", *extra))
        return rc, capsys.readouterr().err.strip()

    rc, err = run("--config.policy.diffusers.sample.solver=dpm2")
    assert rc == 2 and "policy.diffusers.sample.solver" in err and "\n" not in err
    rc, err = run("--config.policy.diffusers.sample.sde_window_size=4",
                  "--config.policy.diffusers.sample.sde_window_range=(8, 10)")
    assert rc == 2 and "sde_window_range" in err and "\n" not in err
