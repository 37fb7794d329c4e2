"""The Wan recipes (configs/wan21_1_3b_*.py, configs/tiny_wan_*.py) load and validate through
wfm_jax.config.recipe, ask for a geometry the Wan VAE and patching take, address real layers with their
LoRA targets, and the tiny ones build a WanPipeline and a video dataset where they point."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config import recipe as cfg
from wfm_jax.config.schema import WAN_LORA_TARGETS

REPO = REPO_ROOT
FULL = ("wan21_1_3b_sft", "wan21_1_3b_sft_lora", "wan21_1_3b_nft", "wan21_1_3b_grpo")
TINY = ("tiny_wan_sft", "tiny_wan_nft")
KINDS = {"wan21_1_3b_sft": "sft", "wan21_1_3b_sft_lora": "sft", "wan21_1_3b_nft": "nft",
         "wan21_1_3b_grpo": "grpo", "tiny_wan_sft": "sft", "tiny_wan_nft": "nft"}


def _load(name, overrides=()):
    return cfg.load_config(os.path.join(REPO, "configs", f"{name}.py"), list(overrides))


@pytest.mark.parametrize("name", FULL + TINY)
def test_recipe_validates_with_a_geometry_wan_takes(name):
    from wfm_jax.models.wan.vae import latent_frames

    c = _load(name)
    d = c.policy.diffusers
    assert c.policy.family == "wan" and d.is_video
    assert c.train.train_policy.type == KINDS[name]
    for frames in (d.train_frames, d.inference_frames):
        latent_frames(frames)  # raises unless 4k + 1
    h, w = d.inference_size
    assert h % 16 == 0 and w % 16 == 0  # VAE x8, then the (1, 2, 2) patch
    if name in FULL:
        assert (h, w, d.train_frames) == (480, 832, 81)  # WanPipeline's defaults
        assert c.policy.model_name_or_path == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
        assert not c.policy.build_tiny and d.max_prompt_length == 512
    else:
        assert c.policy.build_tiny and (h, w, d.train_frames) == (32, 32, 9)
    if c.policy.lora.enable:
        assert tuple(c.policy.lora.target_modules) == WAN_LORA_TARGETS


def test_lora_targets_address_the_released_1_3b_model():
    from flax import nnx

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.lora import find_targets
    from wfm_jax.models.wan import WAN21_T2V_1_3B, WanTransformer

    model = abstract_module(lambda: WanTransformer(WAN21_T2V_1_3B, rngs=nnx.Rngs(0)))
    for name in FULL:
        lora = _load(name).policy.lora
        if lora.enable:
            found = find_targets(model, lora.target_modules)
            assert len(found) == 30 * (2 * 4 + 2), name  # attn1 + attn2 (4 each), 2 FFN linears


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipe_builds_a_wan_pipeline_and_video_data(name, tmp_path, capsys):
    from wfm_jax.data import media
    from wfm_jax.train.setup import ensure_tiny_assets

    overrides = [("policy.model_name_or_path", str(tmp_path / "wan")),
                 ("policy.build_tiny", "True")]  # building away from the recipe's path
    if name == "tiny_wan_sft":  # (RL reads the recipe's prompt file: nothing to build)
        overrides += [("train.train_policy.dataset.local_dir", str(tmp_path / "clips")),
                      ("train.train_policy.dataset.build_tiny", "True")]
    c = _load(name, overrides)
    ensure_tiny_assets(c)
    assert "building the tiny random Wan pipeline" in capsys.readouterr().out
    with open(tmp_path / "wan" / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "WanPipeline"
    if name == "tiny_wan_sft":
        clips = sorted(p for p in os.listdir(tmp_path / "clips") if p.endswith(".mp4"))
        assert len(clips) == 16
        d = c.policy.diffusers
        video = media.load_video_window(str(tmp_path / "clips" / clips[0]), d.inference_size,
                                        d.train_frames, np.random.default_rng(0))
        assert video.shape == (d.train_frames, 32, 32, 3)
        video = media.to_signed_unit(video)
        assert np.abs(video[1] - video[0]).max() > 0.5  # the shapes move


def test_video_dataset_refuses_negative_frames(tmp_path):
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset

    with pytest.raises(ValueError, match="frames must be >= 0"):
        build_shapes_dataset(str(tmp_path / "clips"), count=2, frames=-1)
    assert os.listdir(tmp_path) == []
