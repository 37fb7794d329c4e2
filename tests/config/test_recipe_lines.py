"""Shipped recipes state only what differs from the defaults: a line in a recipe that sets a key
to the value it already has is an error, unless a comment on it (or right above it) says why it
is pinned (a published value the default could drift from)."""
from __future__ import annotations

import glob
import os
import sys

import pytest
from ml_collections import ConfigDict

from tests._support.paths import REPO_ROOT
from wfm_jax.config.recipe import load_config

REPO = REPO_ROOT
RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))


def _same(old, new) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    return not isinstance(new, ConfigDict) and type(old) is type(new) and old == new


def _restating_lines(path: str, monkeypatch) -> list[int]:
    """Line numbers of `path` whose assignment leaves the config unchanged."""
    lines: list[int] = []
    original = ConfigDict.__setattr__

    def tracing(self, key, value):
        caller = sys._getframe(1)
        if (not key.startswith("_") and caller.f_code.co_filename == path and key in self
                and _same(self[key], value)):
            lines.append(caller.f_lineno)
        original(self, key, value)

    monkeypatch.setattr(ConfigDict, "__setattr__", tracing)
    load_config(path, check=False)
    monkeypatch.setattr(ConfigDict, "__setattr__", original)
    return lines


def _documented(source: list[str], lineno: int) -> bool:
    return "#" in source[lineno - 1] or source[lineno - 2].strip().startswith("#")


@pytest.mark.parametrize("path", RECIPES, ids=os.path.basename)
def test_no_line_restates_a_default(path, monkeypatch):
    with open(path) as f:
        source = f.read().split("\n")
    bare = [n for n in _restating_lines(path, monkeypatch) if not _documented(source, n)]
    assert not bare, (f"{os.path.basename(path)} lines {bare} set a key to the value it already "
                      f"has: delete them, or say in a comment why the value is pinned")


def test_the_check_catches_a_restated_default(tmp_path, monkeypatch):
    recipe = tmp_path / "r.py"
    recipe.write_text("from wfm_jax.config.schema import default_config\n\n\n"
                      "def get_config():\n    c = default_config()\n"
                      "    c.train.max_steps = c.train.max_steps\n"
                      "    c.train.seed = 7  # differs: fine\n    return c\n")
    assert _restating_lines(str(recipe), monkeypatch) == [6]
