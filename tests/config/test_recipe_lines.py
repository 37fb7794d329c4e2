"""Shipped recipes state only what differs: a line in a recipe (or a base under configs/base/)
that sets a key to the value it already has is an error. A restated schema default may stay if a
comment on it (or right above it) says why it is pinned (a published value the default could
drift from); a restated value of the recipe's base is always an error: the base already says it."""
from __future__ import annotations

import glob
import os

import pytest

from tests.config._recipe_trace import CONFIGS, trace
from wfm_jax.config.base import get
from wfm_jax.config.schema import default_config

RECIPES = sorted(glob.glob(os.path.join(CONFIGS, "*.py")) + glob.glob(os.path.join(CONFIGS, "base", "*.py")))


def _documented(source: list[str], lineno: int) -> bool:
    return "#" in source[lineno - 1] or source[lineno - 2].strip().startswith("#")


def _restating(path: str, monkeypatch) -> tuple[list[int], list[int]]:
    """(lines restating a schema default without a comment, lines restating a base's value)."""
    with open(path) as f:
        source = f.read().split("\n")
    defaults = default_config()
    bare, from_base = [], []
    for a in trace(path, monkeypatch=monkeypatch).assignments:
        if not (a.direct and a.restated):
            continue
        if get(defaults, a.key) != a.value and not (isinstance(a.value, (list, tuple))
                                                    and list(get(defaults, a.key)) == list(a.value)):
            from_base.append(a.line)
        elif not _documented(source, a.line):
            bare.append(a.line)
    return bare, from_base


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.relpath(p, CONFIGS))
def test_no_line_restates_a_value(path, monkeypatch):
    bare, from_base = _restating(path, monkeypatch)
    name = os.path.relpath(path, CONFIGS)
    assert not bare, (f"{name} lines {bare} set a key to the default it already has: delete them, "
                      f"or say in a comment why the value is pinned")
    assert not from_base, f"{name} lines {from_base} set a key to the value its base already gives it: delete them"


def test_the_check_catches_a_restated_default(tmp_path, monkeypatch):
    recipe = tmp_path / "r.py"
    recipe.write_text("from wfm_jax.config.schema import default_config\n\n\n"
                      "def get_config():\n    c = default_config()\n"
                      "    c.train.max_steps = c.train.max_steps\n"
                      "    c.train.seed = 7  # differs: fine\n    return c\n")
    assert _restating(str(recipe), monkeypatch) == ([6], [])


def test_the_check_catches_a_restated_base_value_even_with_a_comment(tmp_path, monkeypatch):
    (tmp_path / "base.py").write_text("from wfm_jax.config.schema import default_config\n\n\n"
                                      "def get_config():\n    c = default_config()\n"
                                      "    c.train.seed = 7\n    return c\n")
    recipe = tmp_path / "r.py"
    recipe.write_text("from wfm_jax.config.recipe import compose\n\n\n"
                      "def get_config():\n    c = compose('base.py')\n"
                      "    c.train.seed = 7  # pinned\n"
                      "    c.train.max_steps = 5\n    return c\n")
    assert _restating(str(recipe), monkeypatch) == ([], [6])
