"""Recipes compose: every recipe of a released model (and of the tiny world) starts from that
model's base in configs/base/, and a recipe is its parent (the file it composes) plus the lines
of its own file, nothing else. `compose()` itself: where it finds the base, the output_dir it
names after the recipe, the algorithm it sets, and one line when the base is missing."""
from __future__ import annotations

import glob
import os

import pytest

from tests.config._recipe_trace import CONFIGS, flat, trace
from wfm_jax.config.base import ConfigError
from wfm_jax.config.recipe import load_config

# recipe file name prefix -> the base every such recipe must start from
MODEL_BASES = {
    "sd35_": "base/sd35_medium.py",
    "wan21_1_3b_": "base/wan21_1_3b.py",
    "cosmos25_": "base/cosmos25_2b.py",
    "sana_image_": "base/sana_image.py",
    "sana_video_": "base/sana_video.py",
    "reason2_": "base/reason2_2b.py",
    **dict.fromkeys(("tiny_sft", "tiny_nft", "tiny_grpo", "tiny_ddrl", "tiny_wan_", "tiny_cosmos_",
                     "tiny_sana_"), "base/tiny.py"),
}
# still on default_config(): changed on another branch (its algorithm), composed after that lands
NOT_COMPOSED: set[str] = set()
RECIPES = sorted(glob.glob(os.path.join(CONFIGS, "*.py")))
MODEL_RECIPES = [r for r in RECIPES if any(os.path.basename(r).startswith(p) for p in MODEL_BASES)
                 and os.path.basename(r) not in NOT_COMPOSED]


def _base_of(path: str) -> str:
    name = os.path.basename(path)
    return os.path.join(CONFIGS, next(b for p, b in MODEL_BASES.items() if name.startswith(p)))


def test_every_model_has_recipes_on_its_base():
    bases = {_base_of(r) for r in MODEL_RECIPES}
    assert bases == {os.path.join(CONFIGS, b) for b in MODEL_BASES.values()}
    assert all(os.path.isfile(b) for b in bases)


@pytest.mark.parametrize("path", MODEL_RECIPES, ids=os.path.basename)
def test_a_recipe_starts_from_its_model_base(path, monkeypatch):
    runs = [file for file, _ in trace(path, monkeypatch=monkeypatch).runs]
    assert _base_of(path) in runs, f"{os.path.basename(path)} runs {runs}, not its base"


def _unexplained(path, monkeypatch) -> set[str]:
    """Keys where the recipe differs from its parent on no line of its own file."""
    traced = trace(path, monkeypatch=monkeypatch)
    if traced.parent is None:
        pytest.skip("starts from the schema defaults (test_recipe_lines checks its lines)")
    mine, parent = flat(traced.config), flat(trace(*traced.parent, monkeypatch=monkeypatch).config)
    return {k for k in mine if mine[k] != parent[k]} - traced.own_keys()


COMPOSED = [r for r in RECIPES + sorted(glob.glob(os.path.join(CONFIGS, "base", "*.py")))
            if os.path.basename(r) not in NOT_COMPOSED]


@pytest.mark.parametrize("path", COMPOSED, ids=lambda p: os.path.relpath(p, CONFIGS))
def test_a_recipe_is_its_parent_plus_its_own_lines(path, monkeypatch):
    unexplained = _unexplained(path, monkeypatch)
    assert not unexplained, f"{os.path.relpath(path, CONFIGS)} differs from its parent in {unexplained} on no line of its own"
    if "base" not in os.path.relpath(path, CONFIGS):
        assert load_config(path, check=False).train.output_dir == "./outputs/" + os.path.basename(path)[:-3]


def test_the_check_catches_a_recipe_that_is_not_its_parent_plus_its_lines(tmp_path, monkeypatch):
    _write(tmp_path / "a.py", "def get_config():\n    return default_config()\n")
    _write(tmp_path / "b.py", "def get_config():\n    c = default_config()\n    c.train.seed = 3\n    return c\n")
    _write(tmp_path / "r.py", "from wfm_jax.config.recipe import base_recipe\n\n\ndef get_config():\n"
           "    compose('a.py')\n    c = base_recipe(__file__.replace('r.py', 'b.py'))\n"
           "    c.train.max_steps = 5\n    return c\n")
    assert _unexplained(str(tmp_path / "r.py"), monkeypatch) == {"train.seed"}


@pytest.mark.parametrize("base", sorted(set(MODEL_BASES.values())))
def test_a_base_is_a_valid_config_naming_its_model(base):
    config = load_config(os.path.join(CONFIGS, base))  # validated
    assert config.policy.family


def _write(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("from wfm_jax.config.recipe import compose\nfrom wfm_jax.config.schema import default_config\n\n\n"
                    + body)


def test_compose_finds_the_base_next_to_the_recipe_and_names_the_run(tmp_path):
    _write(tmp_path / "base" / "m.py", "def get_config(arg=None):\n    c = default_config()\n"
           "    c.train.seed = 7 if arg is None else int(arg)\n    return c\n")
    _write(tmp_path / "my_run.py", "def get_config():\n    return compose('base/m.py', algorithm='grpo')\n")
    _write(tmp_path / "with_arg.py", "def get_config():\n    return compose('base/m.py:9')\n")
    config = load_config(str(tmp_path / "my_run.py"), check=False)
    assert (config.train.seed, config.train.output_dir, config.train.train_policy.type) == (
        7, "./outputs/my_run", "grpo")
    assert load_config(str(tmp_path / "with_arg.py")).train.seed == 9


def test_compose_falls_back_to_the_checkout_bases(tmp_path):
    """A recipe of your own outside the checkout starts from a shipped base by its configs/ name."""
    _write(tmp_path / "elsewhere" / "mine.py",
           "def get_config():\n    c = compose('base/wan21_1_3b.py', algorithm='nft')\n"
           "    c.policy.lora.enable = True\n    return c\n")
    config = load_config(str(tmp_path / "elsewhere" / "mine.py"), check=False)
    base = load_config(os.path.join(CONFIGS, "base", "wan21_1_3b.py"), check=False)
    assert config.policy.model_name_or_path == base.policy.model_name_or_path != ""
    assert config.train.output_dir == "./outputs/mine"


def test_a_missing_base_is_one_line(tmp_path):
    _write(tmp_path / "r.py", "def get_config():\n    return compose('base/nope.py')\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "r.py"))
    assert "base recipe base/nope.py not found" in str(err.value) and "\n" not in str(err.value)
