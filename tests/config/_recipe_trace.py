"""Which recipe file set which key: loads a recipe with ConfigDict assignments and recipe-file
runs recorded, so the recipe tests can say a recipe is its parent (the file it composes) plus
the lines in its own file, and that no line restates a value it already has."""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from ml_collections import ConfigDict

from wfm_jax.config import recipe as recipe_lib
from wfm_jax.config.base import _path_of, to_plain

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "configs")
RECIPE_MODULE = "wfm_jax_recipe_"  # recipe.py's prefix for the module of a recipe file it runs


@dataclasses.dataclass
class Assignment:
    key: str        # dotted, from the recipe's root
    value: Any
    line: int       # the recipe file's line that made it (directly or through a helper it called)
    direct: bool    # written on that line itself, not inside a helper such as compose()
    restated: bool  # the key already held this value


@dataclasses.dataclass
class Traced:
    config: ConfigDict             # the recipe's get_config() result, unvalidated
    runs: list[tuple[str, str | None]]  # (file, arg) run: the recipe, then the files it composes
    assignments: list[Assignment]  # made by the recipe's own file (its bases' lines excluded)

    @property
    def parent(self) -> tuple[str, str | None] | None:
        return self.runs[1] if len(self.runs) > 1 else None

    def own_keys(self) -> set[str]:
        return {a.key for a in self.assignments}


def same(old, new) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return list(old) == list(new)
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    return not isinstance(new, ConfigDict) and type(old) is type(new) and old == new


def _innermost_recipe_frame(frame):
    while frame is not None and not frame.f_globals.get("__name__", "").startswith(RECIPE_MODULE):
        frame = frame.f_back
    return frame


def trace(path: str, arg: str | None = None, *, monkeypatch) -> Traced:
    path = os.path.abspath(path)
    runs: list[tuple[str, str | None]] = []
    records: list[tuple[ConfigDict, str, Any, int, bool, bool]] = []
    original_setattr, original_run = ConfigDict.__setattr__, recipe_lib._run_recipe

    def tracing(self, key, value):
        if not key.startswith("_"):
            caller = sys._getframe(1)
            owner = _innermost_recipe_frame(caller)
            if owner is not None and owner.f_code.co_filename == path:
                restated = key in self and same(self[key], value)
                records.append((self, key, value, owner.f_lineno, caller is owner, restated))
        original_setattr(self, key, value)

    def running(file, file_arg):
        runs.append((os.path.abspath(file), file_arg))
        return original_run(file, file_arg)

    monkeypatch.setattr(ConfigDict, "__setattr__", tracing)
    monkeypatch.setattr(recipe_lib, "_run_recipe", running)
    try:
        config = recipe_lib._run_recipe(path, arg)
    finally:
        monkeypatch.setattr(ConfigDict, "__setattr__", original_setattr)
        monkeypatch.setattr(recipe_lib, "_run_recipe", original_run)
    assignments = []
    for node, key, value, line, direct, restated in records:
        prefix = _path_of(config, node)
        if prefix is None:  # a config the recipe made and dropped
            continue
        assignments.append(Assignment(f"{prefix}.{key}" if prefix else key, value, line, direct, restated))
    return Traced(config, runs, assignments)


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a config or its plain dict."""
    tree = to_plain(tree) if isinstance(tree, ConfigDict) else tree
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
