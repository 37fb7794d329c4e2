"""SANA and SANA-Video through the shared trainers: tiny NFT runs end to end with validation and
its reward rises (on mean brightness, which the random tiny models move where the recipes' JPEG
sizes of 32x32 images and clips barely do; SANA-Video's export loads in diffusers and gives
the JAX output), tiny SANA SFT lowers the loss, and the Gemma text mask reaches the
cross-attention in the training step (cosmos-rl's NFT update dropped it): changing the
embedding at padded positions must not change the SFT loss nor the NFT loss."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import _rl_toy as toy
from tests._support.paths import CONFIGS, REPO_ROOT
from wfm_jax.cli import main as wmain
from wfm_jax.config.recipe import load_config

ROOT = REPO_ROOT
NFT_STEPS = 14


def _metrics(out_dir) -> dict[int, dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


@pytest.fixture(scope="module")
def sana_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("sana") / "pipe"), family="sana")


def _nft_argv(recipe, pipe, out, steps, *extra):
    # mini_batch 2 per device x the 8 test devices: the batch of 16 in one micro-batch
    return ["--config", os.path.join(CONFIGS, recipe), f"--config.policy.model_name_or_path={pipe}",
            f"--config.train.output_dir={out}", "--config.train.train_policy.mini_batch=2",
            f"--config.train.max_steps={steps}", f"--config.validation.freq={steps // 2}",
            f"--config.train.ckpt.save_freq={steps}", *extra]


@pytest.mark.slow
def test_tiny_sana_nft_reward_rises_with_validation(sana_dir, brightness, tmp_path):
    # mean brightness, not the recipe's JPEG reward: JPEG moved the random tiny SANA by about
    # 1e-5 in 14 steps, a rise that passed or failed with the compiler's rounding (LLVM -O2 vs -O1:
    # 2.96 standard errors at -O1 on seed 0, 3 needed); brightness rose 0.047 / 0.034 / 0.038 (7.4 / 4.8 / 4.8 standard
    # errors) on train seeds 0 / 1 / 2
    out = tmp_path / "nft"
    reward = f'[{{"name": "{brightness}", "weight": 1.0, "score_key": ""}}]'
    assert wmain.main(_nft_argv("tiny_sana_nft.py", sana_dir, out, NFT_STEPS,
                                f"--config.train.train_policy.remote_reward.reward_fns={reward}")) == 0
    m = _metrics(out)
    assert sorted(m) == list(range(1, NFT_STEPS + 1))
    toy.assert_reward_rises(m)
    for key in ("train/loss", "train/policy_loss", "train/kl_loss", "train/grad_norm"):
        assert all(np.isfinite(m[s][key]) for s in m), key
    half = NFT_STEPS // 2
    assert "val/reward_mean" in m[half] and "val/reward_mean" in m[NFT_STEPS]
    assert os.path.isfile(out / "validation" / f"step_{NFT_STEPS}.png")
    assert os.path.isfile(out / "safetensors" / f"step_{NFT_STEPS}" / "model_index.json")


@pytest.fixture
def brightness():
    """Mean pixel value in [0, 1] per video (uint8 (B, C, T, H, W) or images): a reward the
    random tiny SANA-Video raises (measured: seed 0, 12 steps +0.0039 = 4.5 standard errors;
    seed 1, 14 steps +0.0059 = 12 se); the recipe's JPEG reward moved -0.00257 -> -0.00247 in
    20 steps, too little to test."""
    from reward_client.registry import register_reward, unregister_reward

    @register_reward("test_sana_brightness")
    def _brightness(images, prompts, extras):
        return np.asarray(images, np.float32).mean(axis=tuple(range(1, np.ndim(images)))) / 255.0

    yield "test_sana_brightness"
    unregister_reward("test_sana_brightness")


@pytest.mark.slow
def test_tiny_sana_video_nft_reward_rises_with_validation(brightness, tmp_path):
    from wfm_jax.families.tiny import build_tiny_pipeline
    pipe = build_tiny_pipeline(str(tmp_path / "pipe"), family="sana_video")
    out, steps = tmp_path / "nft", NFT_STEPS
    reward = f'[{{"name": "{brightness}", "weight": 1.0, "score_key": ""}}]'
    # rollouts sample train_frames (5), validation inference_frames (the recipe's 9)
    assert wmain.main(_nft_argv("tiny_sana_video_nft.py", pipe, out, steps,
                                "--config.policy.diffusers.train_frames=5",
                                f"--config.train.train_policy.remote_reward.reward_fns={reward}")
                      ) == 0
    m = _metrics(out)
    assert sorted(m) == list(range(1, steps + 1))
    toy.assert_reward_rises(m)
    for key in ("train/reward_mean", "train/loss", "train/grad_norm"):
        assert all(np.isfinite(m[s][key]) for s in m), key
    assert "val/reward_mean" in m[steps // 2] and "val/reward_mean" in m[steps]
    assert os.path.isfile(out / "validation" / f"step_{steps}.mp4")
    _export_reproduces_jax(str(out / "safetensors" / f"step_{steps}"), pipe)


def _export_reproduces_jax(export: str, initial: str) -> None:
    """diffusers loads the run's exported SanaVideoPipeline, and its transformer gives the
    output of the wfm_jax transformer loaded from the same export (a masked prompt); the
    trained weights moved away from the initial ones."""
    import torch
    from diffusers import SanaVideoPipeline
    from flax import nnx

    from wfm_jax.models import load_transformer

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 2, 4, 4)).astype(np.float32)
    text = rng.standard_normal((2, 5, 16)).astype(np.float32)
    t, mask = np.array([900.0, 130.0], np.float32), np.array([[1, 1, 1, 0, 0], [1] * 5])

    def torch_out(directory):
        transformer = SanaVideoPipeline.from_pretrained(directory).transformer.eval()
        with torch.no_grad():
            return transformer(torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(text),
                               timestep=torch.from_numpy(t),
                               encoder_attention_mask=torch.from_numpy(mask)).sample.numpy()

    graph, state = nnx.split(load_transformer(export))
    ours = np.asarray(jax.jit(lambda s: nnx.merge(graph, s)(
        jnp.asarray(x), jnp.asarray(text), jnp.asarray(t),
        encoder_attention_mask=jnp.asarray(mask)))(state))
    want = torch_out(export)
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-4)
    assert np.abs(torch_out(initial) - want).max() > 1e-4


def test_rollouts_sample_train_frames_and_validation_inference_frames(tmp_path):
    from types import SimpleNamespace

    from wfm_jax.families import base as family_lib
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.train import setup as setup_lib
    from wfm_jax.train.rl_setup import RLRun

    config = load_config(os.path.join(CONFIGS, "tiny_sana_video_nft.py"),
                         [("policy.diffusers.train_frames", "5")])
    pipe = family_lib.load_pipeline(build_tiny_pipeline(str(tmp_path / "p"),
                                                        family="sana_video"), family="sana_video")
    mesh = setup_lib.build_mesh(config)
    run = SimpleNamespace(config=config, setup=SimpleNamespace(
        pipe=pipe, batch_sharding=lambda: setup_lib.batch_sharding(mesh)))
    rollout = RLRun.initial_latents(run, jax.random.key(0), 8)
    evaluation = RLRun.initial_latents(run, jax.random.key(0), 8, evaluation=True)
    assert rollout.shape == (8, 4, 2, 4, 4) and evaluation.shape == (8, 4, 3, 4, 4)


def _sft_config(pipe, shapes, out, steps):
    return load_config(os.path.join(CONFIGS, "tiny_sft.py"), [
        ("policy.family", "sana"), ("policy.model_name_or_path", pipe),
        ("policy.build_tiny", "False"), ("train.train_policy.dataset.local_dir", shapes),
        ("train.train_policy.dataset.build_tiny", "False"), ("train.output_dir", str(out)),
        ("train.max_steps", str(steps)), ("train.ckpt.save_freq", str(steps)),
        ("train.ckpt.export_safetensors", "False")])


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    return build_shapes_dataset(str(tmp_path_factory.mktemp("shapes") / "d"), count=16, size=32)


@pytest.mark.slow
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_tiny_sana_sft_loss_falls(sana_dir, shapes_dir, tmp_path):
    from wfm_jax.train import sft
    steps = 12
    sft.run(_sft_config(sana_dir, shapes_dir, tmp_path / "sft", steps))
    m = _metrics(tmp_path / "sft")
    loss = np.array([m[s]["train/loss"] for s in range(1, steps + 1)])
    assert np.all(np.isfinite(loss))
    assert loss[-3:].mean() < loss[:3].mean() - 0.05, loss


@pytest.mark.slow
def test_padded_text_positions_do_not_reach_the_training_losses(sana_dir, shapes_dir, tmp_path):
    """The SFT step's loss and the NFT loss on SANA's conditioning are unchanged when the
    embedding changes where the mask is 0; with the mask all ones (what ignoring it amounts to)
    the same change moves both, so the comparison can fail."""
    from wfm_jax.algorithms.nft.algorithm import nft_grads
    from wfm_jax.programs.encode import TextEncoder
    from wfm_jax.programs.setup import make_velocity
    from wfm_jax.programs.sft import sft_step
    from wfm_jax.train import setup as setup_lib

    config = _sft_config(sana_dir, shapes_dir, tmp_path / "out", 1)
    s = setup_lib.build(config)
    try:
        pipe, d = s.pipe, config.policy.diffusers
        rows = 8  # one per test device
        prompts = ["a red cat", "the blue dog on a photo"] * (rows // 2)
        text = TextEncoder(pipe, d.max_prompt_length)
        cond = jax.device_get(text({k: jnp.asarray(v) for k, v in
                                    text.tokenize(prompts).items()}))
        mask = np.asarray(cond["encoder_attention_mask"])
        assert 0 < mask.sum() < mask.size  # the prompts leave padded positions
        noise = np.random.default_rng(0).normal(size=cond["encoder_hidden_states"].shape)
        padded = dict(cond, encoder_hidden_states=np.where(
            mask[..., None] > 0, cond["encoder_hidden_states"], 5.0 * noise).astype(np.float32))
        x0 = np.random.default_rng(1).normal(
            size=pipe.latent_shape(rows, 32, 32)).astype(np.float32)
        ids = np.arange(rows, dtype=np.int32)
        step = sft_step(s, (pipe.shift, d.weighting_scheme, d.logit_mean, d.logit_std,
                               d.mode_scale, (0, 0)))

        def sft_loss(c):
            state = jax.tree.map(lambda a: a.copy(), s.state)  # the step donates its state
            return float(step(state, s.frozen, *s.global_batch((x0, c, ids)))[1]["loss"])

        velocity = make_velocity(s.graphdef, s.frozen, pipe.shell())
        params = s.state.params
        adv = np.linspace(-1, 1, rows).astype(np.float32)
        sigmas = jnp.linspace(1.0, 0.0, 5)

        @jax.jit
        def nft_loss(c):
            _, metrics = nft_grads(velocity, params, params, params, jnp.asarray(x0), c,
                                   jnp.asarray(adv), jax.random.key(0), sigmas=sigmas,
                                   num_train=2, beta=1.0, kl_weight=0.0, adv_clip_max=5.0)
            return metrics["policy_loss"]

        ones = np.ones_like(mask)
        for loss in (sft_loss, lambda c: float(nft_loss(c))):
            assert loss(padded) == loss(cond)
            unmasked = dict(cond, encoder_attention_mask=ones)
            assert loss(dict(padded, encoder_attention_mask=ones)) != loss(unmasked)
    finally:
        s.close()
