"""The SANA recipes (configs/sana_*.py, configs/tiny_sana_*.py) load and validate through
wfm_jax.config.recipe, ask for a geometry SANA takes (multiples of 32; 4k + 1 frames for video), carry
cosmos-rl's values, address real layers with their LoRA targets, and the tiny ones build a SANA
pipeline where they point."""
from __future__ import annotations

import json
import os

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config import recipe as cfg
from wfm_jax.config.schema import SANA_LORA_TARGETS

REPO = REPO_ROOT
FULL = ("sana_image_sft", "sana_image_sft_lora", "sana_image_nft", "sana_video_sft",
        "sana_video_sft_lora", "sana_video_nft")
TINY = ("tiny_sana_nft", "tiny_sana_video_nft")
# cosmos-rl's configs/sana/*.toml: (lr, weight decay, global batch, mini_batch, n_generation)
COSMOS_RL = {"sana_image_sft": (1e-4, 0.01, 8, 1, None),
             "sana_image_sft_lora": (1e-4, 0.01, 8, 1, None),
             "sana_image_nft": (3e-4, 1e-4, 1152, 9, 24),
             "sana_video_sft": (1e-6, 0.01, 8, 1, None),
             "sana_video_sft_lora": (1e-6, 0.01, 8, 1, None),
             "sana_video_nft": (3e-4, 1e-4, 384, 4, 8)}


def _load(name, overrides=()):
    return cfg.load_config(os.path.join(REPO, "configs", f"{name}.py"), list(overrides))


@pytest.mark.parametrize("name", FULL + TINY)
def test_recipe_validates_with_a_geometry_sana_takes(name):
    c = _load(name)
    d = c.policy.diffusers
    video = "video" in name
    assert c.policy.family == ("sana_video" if video else "sana") and d.is_video == video
    assert c.train.train_policy.type == ("sft" if "sft" in name else "nft")
    h, w = d.inference_size
    assert h % 32 == 0 and w % 32 == 0
    if video:
        assert (d.train_frames - 1) % 4 == 0 and d.inference_frames == d.train_frames
    if c.train.train_policy.type == "nft":
        assert d.sample.solver == "dpm_solver" and d.sample.guidance_scale == 1.0
    if c.policy.lora.enable or name in TINY:
        assert tuple(c.policy.lora.target_modules) == SANA_LORA_TARGETS
    if name in FULL:
        lr, wd, batch, mini, n = COSMOS_RL[name]
        t = c.train
        assert (t.optm_lr, t.optm_weight_decay, t.train_batch_per_replica,
                t.train_policy.mini_batch) == (lr, wd, batch, mini)
        if n is not None:
            assert c.rollout.n_generation == n and t.train_policy.kl_beta == 1e-4
        assert d.max_prompt_length == 300 and not c.policy.build_tiny
        assert (h, w) == ((480, 832) if video else (1024, 1024))
        if c.policy.lora.enable:
            assert (c.policy.lora.r, c.policy.lora.lora_alpha) == (4, 4)
    else:
        assert c.policy.build_tiny and (h, w) == (32, 32)


@pytest.mark.parametrize("fam", ["sana", "sana_video"])
def test_lora_targets_address_every_attention_projection(fam, tmp_path):
    from wfm_jax.families import base as family_lib
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.models.lora import find_targets

    pipe = family_lib.load_pipeline(build_tiny_pipeline(str(tmp_path / "p"), family=fam),
                                    family=fam)
    found = find_targets(pipe.transformer, SANA_LORA_TARGETS)
    layers = pipe.transformer_config["num_layers"]
    assert len(found) == layers * 8, sorted(found)  # attn1 + attn2, q k v out each


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipe_builds_a_sana_pipeline(name, tmp_path, capsys):
    from wfm_jax.train.setup import ensure_tiny_assets

    c = _load(name, [("policy.model_name_or_path", str(tmp_path / "pipe")),
                     ("policy.build_tiny", "True")])
    ensure_tiny_assets(c)
    assert "building the tiny random" in capsys.readouterr().out
    with open(tmp_path / "pipe" / "model_index.json") as f:
        assert json.load(f)["_class_name"] == ("SanaVideoPipeline" if "video" in name
                                               else "SanaPipeline")


def test_dpm_solver_is_refused_for_grpo():
    with pytest.raises(cfg.ConfigError, match="Flow-GRPO samples with one of"):
        _load("tiny_sana_nft", [("train.train_policy.type", "grpo")])


def test_nft_rolls_out_with_sanas_dpm_solver():
    # SANA's scheduler as NFT's rollout solver: DPM-Solver++ on its own sigma grid, fed
    # diffusers' truncated timesteps (as SanaPipeline.sampler_schedule gives); the update keeps
    # the flow grid
    import jax
    import jax.numpy as jnp
    import numpy as np

    from wfm_jax.algorithms.nft.algorithm import NFT
    from wfm_jax.sampling.dpm_solver import dpm_solver_flow_schedule
    from wfm_jax.sampling.samplers import sample
    from wfm_jax.sampling.schedule import flow_sigmas

    config = _load("tiny_sana_nft", [("policy.diffusers.sample.num_steps", "4")])
    algo = NFT.from_recipe(config, 3.0)

    def velocity(params, x, t, cond):
        return params * x + cond * t[:, None, None, None] / 1000.0

    latents = jax.random.normal(jax.random.key(0), (2, 2, 4, 4))
    state = type("S", (), {"aux": {"old": jnp.float32(0.3)}})()
    cond = jnp.ones((2, 1, 1, 1))
    got = algo.rollout(velocity, state, latents, cond, None)["x0"]
    sigmas, timesteps = dpm_solver_flow_schedule(4, 3.0)
    want = sample(lambda x, t, c: velocity(0.3, x, t, c), latents, sigmas, method="dpm_solver",
                  cond=cond, timesteps=timesteps).latents
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(algo.rollout_sigmas), sigmas)
    np.testing.assert_array_equal(np.asarray(algo.rollout_timesteps), timesteps)
    np.testing.assert_array_equal(np.asarray(algo.sigmas), flow_sigmas(4, 3.0)[0])
    euler = sample(lambda x, t, c: velocity(0.3, x, t, c), latents, algo.sigmas, method="euler",
                   cond=cond).latents
    assert np.abs(np.asarray(got) - np.asarray(euler)).max() > 1e-3
