"""The tiny RL recipes live in the shapes world: the pretrained pipeline (built on first use),
shapes_alignment, the train split's prompts asked small and large, validation on the scenes SFT
never saw, asked both ways."""
import os

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config.recipe import load_config
from wfm_jax.worlds.shapes.grammar import SPLIT_SCENES, heldout_scenes, train_scenes
from wfm_jax.worlds.shapes.recipe import (
    HELDOUT_PROMPTS,
    PRETRAINED_DIR,
    TRAIN_PROMPTS,
    UNSIZED_HELDOUT_PROMPTS,
    UNSIZED_TRAIN_PROMPTS,
)

ROOT = REPO_ROOT


def test_prompt_files_are_the_grammar_splits():
    assert open(TRAIN_PROMPTS).read().splitlines() == [s.prompt for s in SPLIT_SCENES["train_sized"]()]
    assert open(HELDOUT_PROMPTS).read().splitlines() == [
        s.prompt for s in SPLIT_SCENES["heldout_sized"]()]
    assert open(UNSIZED_TRAIN_PROMPTS).read().splitlines() == [s.prompt for s in train_scenes()]
    assert open(UNSIZED_HELDOUT_PROMPTS).read().splitlines() == [s.prompt for s in heldout_scenes()]


@pytest.mark.parametrize("name", ["nft", "grpo", "ddrl"])
def test_rl_recipes_use_the_pretrained_shapes_world(name):
    c = load_config(os.path.join(ROOT, "configs", f"tiny_{name}.py"))
    assert c.policy.model_name_or_path == PRETRAINED_DIR and c.policy.build_tiny_pretrained
    assert not c.policy.build_tiny
    assert [f["name"] for f in c.train.train_policy.remote_reward.reward_fns] == ["shapes_alignment"]
    assert c.validation.dataset.local_dir == HELDOUT_PROMPTS and c.validation.val_before_train
    ds = c.train.train_policy.dataset
    if name != "ddrl":
        assert ds.local_dir == TRAIN_PROMPTS
    else:  # DDRL trains on the paired shapes dataset's captions: the sized world's, drawn as asked
        assert ds.build_tiny and (ds.build_tiny_split, ds.build_tiny_layout) == ("train_sized", "fixed")
        assert ds.build_tiny_count == len(open(TRAIN_PROMPTS).read().splitlines())  # every one
    # a model path given on the command line gets nothing built there
    c = load_config(os.path.join(ROOT, "configs", f"tiny_{name}.py"),
                    [("policy.model_name_or_path", "/elsewhere")])
    assert not c.policy.build_tiny_pretrained
