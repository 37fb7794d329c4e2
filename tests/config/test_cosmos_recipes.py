"""The Cosmos-Predict2.5 recipes (configs/cosmos25_*.py, configs/tiny_cosmos_*.py) load and
validate through wfm_jax.config.recipe, ask for a geometry the Cosmos pipeline takes (VAE x patch,
4k+1 frames, within the rotary table), address real layers of the 2B DiT with their LoRA targets,
take cosmos-rl's values, and the tiny ones build a Cosmos pipeline where they point."""
from __future__ import annotations

import json
import os

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config import recipe as cfg
from wfm_jax.config.schema import COSMOS_LORA_TARGETS

REPO = REPO_ROOT
KINDS = {"cosmos25_2b_nft": "nft", "cosmos25_2b_grpo": "wfm_rl", "cosmos25_2b_grpo.py:mock_data":
         "wfm_rl", "cosmos25_2b_flow_grpo": "grpo", "cosmos25_2b_flow_grpo.py:mock_data": "grpo",
         "cosmos25_2b_ddrl": "ddrl", "cosmos25_14b_ddrl": "ddrl",
         "cosmos25_2b_sft": "sft", "tiny_cosmos_nft": "nft", "tiny_cosmos_ddrl": "ddrl"}
TINY = ("tiny_cosmos_nft", "tiny_cosmos_ddrl")


def _load(name, overrides=()):
    spec = name if ".py:" in name else f"{name}.py"
    return cfg.load_config(os.path.join(REPO, "configs", spec), list(overrides))


def _shell(transformer_config):
    """A CosmosPipeline without modules: latent_shape reads configs only."""
    from wfm_jax.families.cosmos.pipeline import CosmosPipeline
    from wfm_jax.families.wan.tiny import vae_config
    return CosmosPipeline("", None, None, None, None, dict(transformer_config),
                          vae_config(), {})


@pytest.mark.parametrize("name", sorted(KINDS))
def test_recipe_validates_with_a_geometry_cosmos_takes(name):
    from wfm_jax.families.cosmos.tiny import transformer_config
    from wfm_jax.models.cosmos.transformer import COSMOS25_PREDICT_2B, COSMOS25_PREDICT_14B

    c = _load(name)
    d = c.policy.diffusers
    assert c.policy.family == "cosmos" and d.is_video
    assert c.train.train_policy.type == KINDS[name]
    model = (transformer_config() if name in TINY else
             COSMOS25_PREDICT_14B if "14b" in name else COSMOS25_PREDICT_2B)
    pipe = _shell(model)
    h, w = d.inference_size
    for frames in (d.train_frames, d.inference_frames):
        pipe.latent_shape(1, h, w, frames)  # raises on a size or frame count Cosmos refuses
    if name in TINY:
        assert c.policy.build_tiny and (h, w, d.train_frames) == (32, 32, 9)
    else:
        assert not c.policy.build_tiny and d.train_frames == 93
        assert c.policy.model_name_or_path.startswith("nvidia/Cosmos-Predict2.5-")
    if c.policy.lora.enable:
        assert tuple(c.policy.lora.target_modules) == COSMOS_LORA_TARGETS


def test_recipes_carry_cosmos_rl_values():
    nft = _load("cosmos25_2b_nft")  # cosmos-predict2-5-2b-720-nft.toml
    assert tuple(nft.policy.diffusers.inference_size) == (512, 512)
    assert nft.rollout.n_generation == 12 and nft.train.train_batch_per_replica == 576
    assert nft.train.train_policy.kl_beta == 1.0 and nft.policy.lora.r == 32
    s = nft.policy.diffusers.sample
    assert (s.num_steps, s.guidance_scale, s.solver, s.deterministic_sampling,
            s.noise_level) == (10, 1.0, "dpm2", True, 0.7)
    assert tuple(_load("cosmos25_2b_grpo").policy.diffusers.inference_size) == (432, 768)
    for name, fsdp, context in (("cosmos25_2b_ddrl", 8, 2), ("cosmos25_14b_ddrl", 32, 8)):
        c = _load(name)
        tp, s = c.train.train_policy, c.policy.diffusers.sample
        assert (c.policy.parallelism.fsdp, c.policy.parallelism.context) == (fsdp, context)
        assert tuple(tp.train_on) == tuple(range(0, 20, 2)) and tp.dataset.layout == "wfm"
        assert (tp.kl_beta, tp.data_beta, tp.use_rl_sigma_and_noise, tp.data_on_first_only) == \
            (0.0, 0.01, True, False)
        assert (s.solver, s.num_steps, s.s_churn, s.edm_sigma_min, s.edm_sigma_max) == \
            ("edm", 20, 1.0, 0.01, 200.0)


def test_grpo_mock_data_needs_no_dataset():
    assert _load("cosmos25_2b_grpo").train.train_policy.dataset.local_dir == ""
    mock = _load("cosmos25_2b_grpo.py:mock_data")  # cosmos-rl's mock-data mode
    assert (mock.train.train_policy.dataset.layout, mock.train.max_steps) == ("mock", 25)
    assert os.path.isfile(_load("cosmos25_2b_flow_grpo.py:mock_data").train.train_policy.dataset.local_dir)
    for name in ("cosmos25_2b_grpo.py:mock", "cosmos25_2b_flow_grpo.py:mock"):
        with pytest.raises(cfg.ConfigError, match="unknown recipe argument 'mock'"):
            _load(name)


def test_cosmos_grpo_recipe_is_cosmos_rls_world_model_step():
    """configs/cosmos25_2b_grpo.py takes the world-model step with cosmos-rl's RLConfig defaults,
    as the 480 "GRPO" TOML resolves."""
    from wfm_jax.algorithms.registry import algorithm_named
    ours = _load("cosmos25_2b_grpo")
    theirs = cfg.load_config(os.path.join(REPO, "tests", "recipes", "cosmos_rl",
                                          "cosmos-predict2-5-2b-480-grpo.toml"))
    cls = algorithm_named("wfm_rl")
    assert cls.Config.from_recipe(ours).step == cls.Config.from_recipe(theirs).step


def test_lora_targets_address_the_released_2b_model():
    from flax import nnx

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.cosmos.transformer import COSMOS25_PREDICT_2B, CosmosTransformer
    from wfm_jax.models.lora import find_targets

    model = abstract_module(lambda: CosmosTransformer(COSMOS25_PREDICT_2B, rngs=nnx.Rngs(0)))
    found = find_targets(model, _load("cosmos25_2b_nft").policy.lora.target_modules)
    assert len(found) == 28 * (2 * 4 + 2)  # attn1 + attn2 (4 each), 2 FFN linears


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipe_builds_a_cosmos_pipeline(name, tmp_path, capsys):
    from wfm_jax.train.setup import ensure_tiny_assets

    c = _load(name, [("policy.model_name_or_path", str(tmp_path / "cosmos")),
                     ("policy.build_tiny", "True"),
                     ("train.train_policy.dataset.build_tiny", "False")])
    ensure_tiny_assets(c)
    assert "building the tiny random Cosmos pipeline" in capsys.readouterr().out
    with open(tmp_path / "cosmos" / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "Cosmos2_5_PredictBasePipeline"
