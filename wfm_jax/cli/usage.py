"""`python -m wfm_jax.main --help`: how to call the trainer and which recipes ship with it."""
from __future__ import annotations

import ast
import os

USAGE = """usage: python -m wfm_jax.main --config=configs/X.py [--config.a.b=VALUE ...]

Trains with the recipe X (a Python file with get_config()); every --config.a.b=VALUE overrides
one key of it (all keys and defaults: wfm_jax/config/schema.py). Resume a run with
--config.train.resume=True. Print the resolved config without training:
python -m wfm_jax.config --config=configs/X.py [--config.a.b=VALUE ...]

cosmos-rl TOML recipes load as they are: --config=recipe.toml; add --dry-run to print the
resolved config and what the run would load; cosmos-rl's launcher flag --wfm-mode MODULE is
accepted (docs/cosmos_rl_migration.md)."""


def recipes_dir() -> str:
    """configs/ of the checkout this package was imported from."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def _summary(path: str, width: int = 88) -> str:
    """The first sentence of a recipe's docstring, cut to `width` characters."""
    try:
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
    except (OSError, SyntaxError):
        return ""
    text = " ".join(doc.split("\n\n")[0].split())
    for stop in (". ", ": "):
        text = text.split(stop)[0]
    text = text.rstrip(".")
    return text if len(text) <= width else text[:width - 3] + "..."


def recipes(directory: str | None = None) -> list[tuple[str, str]]:
    """[(configs/name.py, summary)] for every recipe file, sorted by name."""
    directory = directory or recipes_dir()
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.endswith(".py") and not n.startswith("_"))
    return [(f"configs/{n}", _summary(os.path.join(directory, n))) for n in names]


def usage_text(directory: str | None = None) -> str:
    found = recipes(directory)
    if not found:
        return USAGE + "\n\nrecipes: none found next to this install (see configs/ in the repository)"
    width = max(len(name) for name, _ in found)
    lines = [f"  {name:<{width}}  {summary}" for name, summary in found]
    return USAGE + "\n\nrecipes:\n" + "\n".join(lines)
