"""Config files, `--config.a.b=value` overrides, locking and validation.

A recipe is a Python file exposing `get_config()` (optionally `get_config(arg)`, selected with
`path.py:arg`) that starts from `wfm_jax.config.schema.default_config()`, or from another recipe
file with `compose("base/<model>.py")`, and changes values. The tree is locked: a key that is not
in the schema is an error naming the nearest valid key, whether the typo is in the recipe, in an
override, or in a resolved config.json. Unlike cosmos-rl, nothing is silently ignored.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from wfm_jax.config import checks, schema  # noqa: F401  (checks: registers the cross-key checks)
from wfm_jax.config.base import (  # noqa: F401  (re-exported: the loader's public names)
    _CHECKS,
    REDACTED,
    SECRET_KEYS,
    ConfigDict,
    ConfigError,
    _path_of,
    _resolve,
    _type_name,
    apply_override,
    field_type,
    get,
    is_secret,
    parse_overrides,
    parse_value,
    redacted,
    register_check,
    set_value,
    to_plain,
    unknown_key_message,
)
from wfm_jax.config.cosmos_toml import ignored_note, read_recipe
from wfm_jax.io.atomic import write_text_atomic

# --------------------------------------------------------------------------- recipe files


def _recipe_error(exc: BaseException) -> ConfigError | None:
    """Turn ml_collections' locked-dict / type errors raised inside a recipe into our one-liners,
    prefixed with the recipe line that made them. The failing ConfigDict is `self` in the first
    ml_collections frame; its dotted path is found by searching the ConfigDicts held by the
    calling frames (the recipe's `config`, or a base recipe's)."""
    tb = exc.__traceback__
    node, roots, value, where = None, [], None, None
    key = getattr(exc, "args", [None])[0]
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if isinstance(owner, ConfigDict):
            if node is None:
                node = owner
                key = frame.f_locals.get("attribute", frame.f_locals.get("key", key))
                value = frame.f_locals.get("value", "?")
        elif node is None:
            roots.extend(v for v in frame.f_locals.values() if isinstance(v, ConfigDict))
            where = f"{os.path.basename(frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    if node is None or not isinstance(key, str):
        return None
    found = [(p, r) for r in roots for p in [_path_of(r, node)] if p is not None]
    path, root = max(found, key=lambda pr: len(pr[0])) if found else ("", node)
    full = f"{path}.{key}" if path else key
    if isinstance(exc, TypeError):
        return ConfigError(f"{where}: config key '{full}' expects {_type_name(node.get_type(key))}, "
                           f"got {value!r} ({_type_name(type(value))})")
    if key in node:
        return None
    return ConfigError(f"{where}: {unknown_key_message(root, node, full)}")


def _run_recipe(path: str, arg: str | None) -> Any:
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    name = "wfm_jax_recipe_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigError(f"{path} has no get_config()")
        return module.get_config(arg) if arg is not None else module.get_config()
    except ConfigError:
        raise
    except (AttributeError, KeyError, TypeError) as e:
        converted = _recipe_error(e)
        if converted is not None:
            raise converted from e
        raise ConfigError(f"{path}: {type(e).__name__}: {e}") from e
    except Exception as e:  # one line for the user; the chained traceback keeps the detail
        raise ConfigError(f"{path}: {type(e).__name__}: {e}") from e


# --------------------------------------------------------------------------- validation hooks


def validate(config: ConfigDict) -> ConfigDict:
    _import_schema()
    for check in _CHECKS:
        check(config)
    return config


# --------------------------------------------------------------------------- public entry points

def _import_schema():
    return schema


def from_tree(tree: Any) -> ConfigDict:
    """A locked default config with every value of `tree` (dict / ConfigDict) set into it."""
    config = _import_schema().default_config()
    if tree is not None:
        for key, value in tree.items():
            set_value(config, key, value)
    return config


def base_recipe(path: str, arg: str | None = None) -> Any:
    """The unvalidated ConfigDict of another recipe file, for a recipe that is that recipe plus a
    few keys (`compose` does the same with the path relative to the recipe and its output_dir)."""
    return _run_recipe(path, arg)


def _checkout_configs() -> str:
    """configs/ of the checkout this package was imported from (absent in an installed wheel)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def compose(base: str, algorithm: str | None = None) -> Any:
    """A recipe's starting point: the config of the recipe file `base` (`path.py` or `path.py:arg`,
    e.g. "base/wan21_1_3b.py" or "wan21_1_3b_sft.py"), with train.output_dir set to
    ./outputs/<name of the recipe file that calls compose> and, given `algorithm`,
    train.train_policy.type set to it. A relative `base` is looked up next to the calling recipe,
    then in the checkout's configs/, so a recipe of your own elsewhere can start from a shipped
    base."""
    caller = sys._getframe(1).f_globals.get("__file__")  # the recipe module whose get_config() calls
    path, arg = base, None
    if ".py:" in base:
        path, arg = base.split(".py:", 1)
        path += ".py"
    if not os.path.isabs(path):
        here = os.path.dirname(os.path.abspath(caller)) if caller else os.getcwd()
        folders = [here, _checkout_configs()]
        tried = [os.path.join(folder, path) for folder in folders]
        found = [t for t in tried if os.path.isfile(t)]
        if not found:
            raise ConfigError(f"base recipe {base} not found (looked for {' and '.join(tried)})")
        path = found[0]
    config = _run_recipe(path, arg)
    if caller:
        config.train.output_dir = "./outputs/" + os.path.splitext(os.path.basename(caller))[0]
    if algorithm is not None:
        config.train.train_policy.type = algorithm
    return config


def load_config(spec: str, overrides: Sequence[tuple[str, str]] = (), check: bool = True) -> ConfigDict:
    """`configs/X.py[:arg]` or a cosmos-rl `recipe.toml`, + [(dotted key, text)] -> validated,
    locked ConfigDict. Overrides use wfm_jax's keys in both cases."""
    if spec.endswith(".toml"):
        notes: list[str] = []
        tree, ignored = read_recipe(spec, notes)
        try:
            config = from_tree(tree)
        except ConfigError as e:
            raise ConfigError(f"{spec}: {e}") from e
        for line in notes + ([ignored_note(ignored)] if ignored else []):
            print(line, file=sys.stderr)
        for key, text in overrides:
            apply_override(config, key, text)
        _tiny_mock(config, [key for key, _ in overrides])
        return validate(config) if check else config
    path, arg = spec, None
    if ".py:" in spec:
        path, arg = spec.split(".py:", 1)
        path += ".py"
    result = _run_recipe(path, arg)
    if not isinstance(result, (dict, ConfigDict)):
        raise ConfigError(f"{path}: get_config() returned {type(result).__name__}, not a ConfigDict")
    config = from_tree(result)
    for key, text in overrides:
        apply_override(config, key, text)
    _build_tiny_only_at_recipe_paths(config, [key for key, _ in overrides])
    return validate(config) if check else config


def _tiny_mock(config: ConfigDict, overridden: Sequence[str]) -> None:
    """cosmos-rl's mock-data recipe with --config.policy.build_tiny=True: the random model is
    the tiny Cosmos twin (built under output_dir, which gains "_tiny" so a full-size run's
    stays apart) and the mock videos shrink to its size; keys given on the command line stay
    as given."""
    if not (config.policy.build_tiny and config.train.train_policy.dataset.layout == "mock"):
        return
    from wfm_jax.families.cosmos import tiny
    d = config.policy.diffusers
    if "train.output_dir" not in overridden:
        config.train.output_dir = config.train.output_dir.rstrip("/") + "_tiny"
    shrunk = {"policy.model_name_or_path": os.path.join(config.train.output_dir, "tiny_cosmos"),
              "policy.diffusers.inference_size": (tiny.HEIGHT, tiny.WIDTH),
              "policy.diffusers.train_frames": tiny.FRAMES,
              "policy.diffusers.inference_frames": tiny.FRAMES}
    for key, value in shrunk.items():
        if key not in overridden:
            set_value(config, key, value)
    print(f"note: tiny mock run: the tiny Cosmos twin at {config.policy.model_name_or_path}, mock "
          f"videos of {d.train_frames} frames at {tuple(d.inference_size)}", file=sys.stderr)


def _build_tiny_only_at_recipe_paths(config: ConfigDict, overridden: Sequence[str]) -> None:
    """A path given on the command line (a typo, say) must not get a random tiny model or
    dataset built there: the recipe's build_tiny covers its own path only, unless the build
    key is overridden too."""
    for path_key, build_key in _import_schema().TINY_BUILDS:
        if path_key in overridden and build_key not in overridden:
            node, key = _resolve(config, build_key)
            node[key] = False


def config_from_argv(argv: Sequence[str]) -> ConfigDict:
    path, overrides = parse_overrides(argv)
    if path is None:
        raise ConfigError("no config file given: pass --config=configs/X.py (or a cosmos-rl recipe.toml)")
    return load_config(path, overrides)


def save_resolved(config: ConfigDict, path: str) -> str:
    """Write the resolved config as JSON atomically (temp file in the same dir, then rename),
    secrets (SECRET_KEYS) masked: a resumed run takes them from its flags or environment."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    text = json.dumps(redacted(to_plain(config)), indent=2, sort_keys=False) + "\n"
    return write_text_atomic(path, text, fsync=True)


def load_resolved(path: str, check: bool = True) -> ConfigDict:
    """Read a config.json written by save_resolved back into a locked config."""
    try:
        with open(path) as f:
            tree = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    try:
        config = from_tree(tree)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    return validate(config) if check else config


def main(argv: Sequence[str] | None = None) -> int:
    """python -m wfm_jax.config.recipe --config=configs/X.py [--config.a.b=v]: print the resolved config."""
    try:
        print(json.dumps(to_plain(config_from_argv(sys.argv[1:] if argv is None else argv)), indent=2))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
