"""The typed RL algorithm interface: each algorithm's Config defaults are the recipe schema's
defaults (cosmos-rl's), a recipe reaches every field, the name table resolves each recipe type,
and an algorithm that leaves an abstract method out cannot be built."""
from __future__ import annotations

import dataclasses

import pytest

from wfm_jax.algorithms.base import AlgorithmConfig, AlgorithmConfigError, MediaConfig, RLAlgorithm
from wfm_jax.algorithms.ddrl import DDRL, DDRLConfig
from wfm_jax.algorithms.grpo import GRPO, GRPOConfig
from wfm_jax.algorithms.nft import NFT, NFTConfig
from wfm_jax.algorithms.registry import ALGORITHMS, algorithm_named
from wfm_jax.config.schema import default_config


def _recipe(kind: str):
    c = default_config()
    c.train.train_policy.type = kind
    if kind == "grpo":
        c.policy.diffusers.sample.solver = "sde"  # Flow-GRPO's sampler (the schema's is NFT's)
    if kind == "ddrl":
        c.policy.diffusers.sample.num_steps = 20  # the default train_on needs 20 steps
    return c


@pytest.mark.parametrize("cls", [NFTConfig, GRPOConfig, DDRLConfig])
def test_config_defaults_are_the_recipe_defaults(cls):
    kind = {NFTConfig: "nft", GRPOConfig: "grpo", DDRLConfig: "ddrl"}[cls]
    got = cls.from_recipe(_recipe(kind))
    want = cls()
    if cls is DDRLConfig:
        want = dataclasses.replace(want, num_steps=20)
    assert got == want
    assert got.media == MediaConfig()  # seed 42, 512^2, 16 frames, text2world


def test_a_recipe_reaches_every_field():
    c = _recipe("grpo")
    c.train.train_policy.kl_beta, c.train.train_policy.advantage_low = 0.5, -2.0
    c.policy.diffusers.sample.sde_window_size = 3
    c.policy.diffusers.max_num_conditional_frames = 2
    got = GRPOConfig.from_recipe(c)
    assert (got.kl_beta, got.advantage_low, got.window_size) == (0.5, -2.0, 3)
    assert got.media.cond_frames == (0, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.kl_beta = 1.0


def test_name_table_and_typed_errors():
    assert dict(ALGORITHMS) == {"nft": NFT, "grpo": GRPO, "ddrl": DDRL}
    for name, cls in ALGORITHMS.items():
        assert algorithm_named(name) is cls and cls.name == name
        assert issubclass(cls, RLAlgorithm) and issubclass(cls.Config, AlgorithmConfig)
    with pytest.raises(AlgorithmConfigError, match=r"'sfx' has no RL trainer; available: "
                                                    r"\['ddrl', 'grpo', 'nft'\]"):
        algorithm_named("sfx")
    c = _recipe("ddrl")
    c.policy.diffusers.sample.num_steps = 10
    with pytest.raises(AlgorithmConfigError, match="train.train_policy.train_on"):
        DDRLConfig.from_recipe(c)


def test_the_reference_is_kept_as_each_algorithm_needs():
    params = {"w": 1.0}
    nft = NFT.aux_fn(NFTConfig(), lora=False)(params)
    assert set(nft) == {"old", "ref"}
    assert set(NFT.aux_fn(NFTConfig(), lora=True)(params)) == {"old"}  # base model: adapters 0
    assert set(GRPO.aux_fn(GRPOConfig(kl_beta=0.0), lora=False)(params)) == set()
    # DDRL's reference follows the policy (update_ref_every_iter > 0): kept under LoRA too
    assert set(DDRL.aux_fn(DDRLConfig(), lora=True)(params)) == {"ref"}
    assert set(DDRL.aux_fn(DDRLConfig(update_ref_every_iter=0), lora=True)(params)) == set()


def test_an_algorithm_must_define_rollout_final_latents_and_grads():
    class Partial(RLAlgorithm[AlgorithmConfig]):
        name = "partial"

        def rollout(self, velocity, state, latents, cond, key, **inputs):
            return {}

    with pytest.raises(TypeError, match="abstract"):
        Partial(AlgorithmConfig(), 3.0)
