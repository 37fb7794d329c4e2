"""video2world in the RL algorithms on a tiny random Cosmos DiT (issue #13): the condition a
rollout used (conditional latents, mask, conditional_frame_timestep) is the one the update
recomputes with, for Flow-GRPO (with CFG: the unconditional branch is conditioned on the same
frames) and DiffusionNFT, and the conditional latent frames contribute nothing to NFT's loss."""
from __future__ import annotations

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests._support.paths import CONFIGS
from wfm_jax.config import recipe as cfg

CONFIGS = CONFIGS


@pytest.fixture(scope="module")
def tiny():
    """(pipe shell, velocity(params, x, t, cond) with the family's guide, params, text, uncond,
    video condition on 1 latent frame for row 0 and 2 for row 1, initial noise)."""
    from wfm_jax.algorithms.base import Velocity
    from wfm_jax.families.cosmos.pipeline import CosmosPipeline
    from wfm_jax.families.cosmos.tiny import scheduler_config, transformer_config
    from wfm_jax.families.wan.tiny import vae_config
    from wfm_jax.models.cosmos.transformer import CosmosTransformer
    pipe = CosmosPipeline("", None, None, None, None, transformer_config(), vae_config(),
                          scheduler_config())
    graphdef, params = nnx.split(CosmosTransformer(transformer_config(), rngs=nnx.Rngs(0)))

    def fn(p, x, t, cond):
        return pipe.velocity_with(nnx.merge(graphdef, p), x, t, cond)
    velocity = Velocity(fn, pipe.guide)  # as programs.setup.make_velocity builds it

    shape = pipe.latent_shape(2, 32, 32, 9)
    k = jax.random.split(jax.random.key(3), 4)
    text = {"encoder_hidden_states": jax.random.normal(k[0], (2, 5, pipe.text_width))}
    uncond = {"encoder_hidden_states": jax.random.normal(k[1], (1, 5, pipe.text_width))}
    video = pipe.video_condition(jax.random.normal(k[2], shape), jnp.asarray([1, 2]))
    return types.SimpleNamespace(pipe=pipe, velocity=velocity, params=params, text=text,
                                 uncond=uncond, video=video,
                                 noise=jax.random.normal(k[3], shape))


def _config(recipe, *overrides):
    return cfg.load_config(os.path.join(CONFIGS, recipe), list(overrides))


def test_grpo_update_recomputes_the_rollout_log_probs_under_its_video_condition(tiny):
    from wfm_jax.algorithms.grpo.algorithm import GRPO
    c = _config("cosmos25_2b_flow_grpo.py", ("policy.diffusers.sample.num_steps", "2"),
                ("policy.diffusers.sample.guidance_scale", "3.0"),
                ("policy.diffusers.max_num_conditional_frames", "2"),
                ("train.train_policy.timesteps_fraction", "1.0"))
    algo = GRPO.from_recipe(c, tiny.pipe)
    state = types.SimpleNamespace(params=tiny.params)
    cond = {**tiny.text, **tiny.video}
    fields = jax.jit(lambda p, x, cnd, u: algo.rollout(
        tiny.velocity, types.SimpleNamespace(params=p), x, cnd, jax.random.key(0), uncond=u))(
        tiny.params, tiny.noise, cond, tiny.uncond)
    assert fields["log_prob"].shape == (2, 2)

    def update_log_probs(batch_cond):
        batch = {k: fields[k] for k in ("traj", "sigmas", "log_prob")}
        batch.update(cond=batch_cond, advantage=jnp.asarray([1.0, -1.0]))
        _, metrics, lps = jax.jit(lambda b: algo.grads(tiny.velocity, state, tiny.params, b,
                                                       jax.random.key(1), first=True,
                                                       uncond=tiny.uncond))(batch)
        return metrics, np.asarray(lps)

    metrics, lps = update_log_probs(cond)
    np.testing.assert_allclose(lps, np.asarray(fields["log_prob"]), atol=2e-5, rtol=0)
    assert float(metrics["rollout_log_prob_gap"]) < 2e-5
    # the same update without the frames (text2world numerics) is far from the rollout
    _, plain = update_log_probs(tiny.text)
    assert np.abs(plain - np.asarray(fields["log_prob"])).max() > 1e-2


def test_nft_rollout_keeps_the_conditioned_frames_and_the_loss_ignores_them(tiny):
    from wfm_jax.algorithms.nft import nft_loss, train_timesteps
    from wfm_jax.algorithms.nft.algorithm import NFT, nft_grads
    c = _config("tiny_cosmos_nft.py", ("policy.diffusers.sample.num_steps", "3"),
                ("policy.diffusers.max_num_conditional_frames", "2"))
    algo = NFT.from_recipe(c, tiny.pipe)
    cond = {**tiny.text, **tiny.video}
    x0 = jax.jit(lambda p, x, cnd: algo.rollout(tiny.velocity, types.SimpleNamespace(
        aux={"old": p}), x, cnd, jax.random.key(0))["x0"])(tiny.params, tiny.noise, cond)
    mask = np.asarray(tiny.video["cond_mask"])[:, 0, :, 0, 0]  # (2, T') rows [1,0,0], [1,1,0]
    c_lat = np.asarray(tiny.video["cond_latents"])
    for row, n in enumerate((1, 2)):
        np.testing.assert_allclose(np.asarray(x0)[row, :, :n], c_lat[row, :, :n], atol=1e-5)
        assert mask[row].sum() == n

    # the update: a moved policy, its loss vs the same loss on the free frames alone
    moved = jax.tree.map(lambda p: p * 1.05, tiny.params)
    adv, key = jnp.asarray([1.5, -0.5]), jax.random.key(5)
    kw = dict(sigmas=algo.sigmas, num_train=1, beta=algo.beta, kl_weight=0.0,
              adv_clip_max=algo.adv_clip, adv_clip_min=algo.adv_low)
    _, metrics = jax.jit(lambda: nft_grads(tiny.velocity, moved, tiny.params, tiny.params, x0,
                                           cond, adv, key, **kw))()
    # one program (eager, each op compiled on its own: ~190 programs)
    @jax.jit
    def independent():
        k_t, k_eps = jax.random.split(key)
        t = train_timesteps(k_t, jnp.asarray(algo.sigmas)[:-1], 2, 1)[:, 0]
        eps = jax.random.normal(k_eps, (1,) + x0.shape)[0]
        tt = t.reshape(2, 1, 1, 1, 1)
        x_t = (1 - tt) * x0 + tt * eps
        v_theta = tiny.velocity(moved, x_t, 1000 * t, cond)
        v_old = tiny.velocity(tiny.params, x_t, 1000 * t, cond)
        free = [nft_loss(v_theta[i:i + 1, :, n:], v_old[i:i + 1, :, n:], x0[i:i + 1, :, n:],
                         x_t[i:i + 1, :, n:], t[i:i + 1], adv[i:i + 1], beta=algo.beta,
                         adv_clip_max=algo.adv_clip, adv_clip_min=algo.adv_low,
                         kl_weight=0.0)[1]["policy_loss"] for i, n in enumerate((1, 2))]
        return tt, x_t, v_theta, v_old, free
    tt, x_t, v_theta, v_old, free = independent()
    # on conditioned frames both policies predict the clean latent exactly: no loss there
    for v in (v_theta, v_old):
        err = np.asarray(x_t - tt * v - x0)
        assert np.abs(err[0, :, :1]).max() < 1e-4 and np.abs(err[1, :, :2]).max() < 1e-4
        assert np.abs(err[:, :, 2:]).max() > 1e-2
    free = [np.asarray(f) for f in free]
    np.testing.assert_allclose(float(metrics["policy_loss"]), np.mean(free), rtol=1e-4)


def test_ddrl_rollout_with_cfg_conditions_both_branches_on_the_frames(tiny):
    """DDRL's EDM rollout with guidance 3 and conditional frames equals the same sampler driven
    by the family's own calls (each branch through velocity_with with the frames, combined by
    its guide), as diffusers' Cosmos pipeline conditions its negative branch; leaving the frames
    out of the negative branch changes it."""
    from wfm_jax.algorithms.ddrl.algorithm import DDRL
    from wfm_jax.sampling.samplers import sample
    c = _config("tiny_cosmos_ddrl.py", ("policy.diffusers.sample.num_steps", "3"),
                ("policy.diffusers.sample.guidance_scale", "3.0"),
                ("train.train_policy.train_on", "(0, 1)"))
    algo = DDRL.from_recipe(c, tiny.pipe)
    cond = {**tiny.text, **tiny.video}
    key = jax.random.key(4)
    got = jax.jit(lambda p, x, cnd, u: algo.rollout(
        tiny.velocity, types.SimpleNamespace(params=p), x, cnd, key, uncond=u)["final"])(
        tiny.params, tiny.noise, cond, tiny.uncond)

    neg = jnp.broadcast_to(tiny.uncond["encoder_hidden_states"],
                           tiny.text["encoder_hidden_states"].shape)

    def by_hand(with_frames: bool):
        def guided(x, t, _):
            v_c = tiny.velocity(tiny.params, x, t, cond)
            u = {"encoder_hidden_states": neg, **(tiny.video if with_frames else {})}
            return tiny.pipe.guide(v_c, tiny.velocity(tiny.params, x, t, u), 3.0)
        k_sde = jax.random.split(key)[1]  # DDRL.rollout's split
        return jax.jit(lambda x: sample(guided, x * algo.sigma_max, algo.sigmas, k_sde,
                                        method="edm", cond=None, **algo.churn).latents)(tiny.noise)

    # 1e-5 relative: the EDM states reach |x| ~ 9 here (measured max error 1.2e-5, i.e. 1.4e-6
    # relative: one batched [uncond; cond] call against two separate ones)
    got = np.asarray(got)
    scale = np.abs(got).max()
    assert np.abs(got - np.asarray(by_hand(True))).max() <= 1e-5 * scale
    assert np.abs(got - np.asarray(by_hand(False))).max() > 1.0  # measured 124
    # the conditioned frames come out as the condition's latents
    c_lat = np.asarray(tiny.video["cond_latents"])
    for row, n in enumerate((1, 2)):
        np.testing.assert_allclose(got[row, :, :n], c_lat[row, :, :n], atol=1e-5)


def test_a_clip_shorter_than_its_conditioning_window_is_one_line(tmp_path):
    """video2world reads the first latent frames of a train_frames window: a clip shorter than
    the window (5 frames, train_frames 9) stops the run with one DataError line naming it."""
    from tests.data.test_data_wfm import make_wfm
    from wfm_jax.algorithms.base import MediaConfig
    from wfm_jax.algorithms.media import ItemMedia
    from wfm_jax.algorithms.nft.algorithm import NFT
    from wfm_jax.data.errors import DataError
    make_wfm(tmp_path / "wfm", embedding=None)
    c = _config("tiny_cosmos_nft.py", ("policy.diffusers.max_num_conditional_frames", "1"),
                ("train.train_policy.dataset.local_dir", str(tmp_path / "wfm")),
                ("validation.dataset.holdout_fraction", "0.0"))
    records, _ = NFT.records(NFT.Config.from_recipe(c), c)
    batch = {"records": records, "index": np.arange(len(records)), "step": 0}
    with pytest.raises(DataError, match=r"a\.mp4 has 5 frames, fewer than train_frames=9"):
        ItemMedia(MediaConfig.from_recipe(c)).latents(None, batch, 0, 1)
