"""What every config module shares: the ConfigError, dotted-key lookup with nearest-key hints,
typed `--config.a.b=value` parsing, the check registry the schema fills, and plain/redacted views.
Below both the schema and the recipe loader, so neither imports the other's internals."""
from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from wfm_jax.core.errors import UserError

ConfigDict = ml_collections.ConfigDict

class ConfigError(UserError, ValueError):
    """A bad config: the message is one line naming the offending key or file."""

def _leaf_paths(node: ConfigDict, prefix: str = "") -> Iterable[str]:
    for key in node.keys():
        path = f"{prefix}{key}"
        yield path
        value = node[key]
        if isinstance(value, ConfigDict):
            yield from _leaf_paths(value, path + ".")

def unknown_key_message(root: ConfigDict, node: ConfigDict, full_key: str) -> str:
    """"unknown key 'a.b.c'; did you mean 'd'?" with the nearest key at that level, else the
    same name elsewhere in the tree, else the keys that do exist there."""
    leaf = full_key.split(".")[-1]
    here = list(node.keys())
    close = difflib.get_close_matches(leaf, here, n=1, cutoff=0.6)
    close = close or [k for k in here if k.startswith(leaf) or leaf.startswith(k)][:1]
    if close:
        return f"unknown key '{full_key}'; did you mean '{close[0]}'?"
    everywhere = list(_leaf_paths(root))
    same_leaf = [p for p in everywhere if p.split(".")[-1] == leaf]
    if same_leaf:
        return f"unknown key '{full_key}'; did you mean '{same_leaf[0]}'?"
    close = difflib.get_close_matches(leaf, [p.split(".")[-1] for p in everywhere], n=1, cutoff=0.75)
    if close:
        match = next(p for p in everywhere if p.split(".")[-1] == close[0])
        return f"unknown key '{full_key}'; did you mean '{match}'?"
    return f"unknown key '{full_key}'; valid keys there: {', '.join(sorted(here))}"

def _resolve(root: ConfigDict, dotted: str) -> tuple[ConfigDict, str]:
    """The parent node of `dotted` and its last component; unknown components are ConfigErrors."""
    parts = dotted.split(".")
    node = root
    for i, part in enumerate(parts):
        prefix = ".".join(parts[: i + 1])
        if part not in node:
            raise ConfigError(unknown_key_message(root, node, dotted if i == len(parts) - 1 else prefix))
        if i == len(parts) - 1:
            return node, part
        child = node[part]
        if not isinstance(child, ConfigDict):
            raise ConfigError(f"'{prefix}' is a value, not a section, so '{dotted}' does not exist")
        node = child
    raise ConfigError(f"empty config key '{dotted}'")

def field_type(node: ConfigDict, key: str) -> type:
    """The declared type of a field (placeholders keep theirs even while None)."""
    return node.get_type(key)

_TRUE = {"true", "t", "yes", "y", "1", "on"}

_FALSE = {"false", "f", "no", "n", "0", "off"}

def _type_name(t: type) -> str:
    return getattr(t, "__name__", str(t))

def _coerce(value: Any, want: type, key: str, example: Any = None) -> Any:
    """Python value -> the field's type (int widens to float; list <-> tuple), else ConfigError."""
    if want is type(None) or value is None:
        return value
    if want is bool:
        if isinstance(value, bool):
            return value
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif want is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif want in (tuple, list):
        if isinstance(value, (tuple, list)):
            items = list(value)
            kinds = {type(x) for x in (example or ())}
            if len(kinds) == 1 and items:
                (kind,) = kinds
                if kind in (int, float, bool, str):
                    items = [_coerce(x, kind, key) for x in items]
            return want(items)
    elif want is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, want):
        return value
    raise ConfigError(f"config key '{key}' expects {_type_name(want)}, got {value!r} "
                      f"({_type_name(type(value))})")

def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text

def parse_value(text: str, want: type, key: str, example: Any = None) -> Any:
    """Command-line text -> value of the field's type, the way ml_collections reads flags."""
    stripped = text.strip()
    if stripped in ("None", "none", "null") and want is not str:
        return None  # ml_collections lets any field hold None (placeholders default to it)
    if want is bool:
        low = stripped.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"config key '{key}' expects bool (true/false), got '{text}'")
    if want is int:
        try:
            return int(stripped)
        except ValueError:
            raise ConfigError(f"config key '{key}' expects int, got '{text}'") from None
    if want is float:
        try:
            return float(stripped)
        except ValueError:
            raise ConfigError(f"config key '{key}' expects float, got '{text}'") from None
    if want is str:
        return text
    if want in (tuple, list):
        if stripped in ("", "()", "[]"):
            return want()
        value = _literal(stripped)
        if isinstance(value, str):  # unquoted words: "attn.to_q,attn.to_k"
            value = [w.strip() for w in stripped.strip("()[]").split(",") if w.strip()]
            value = [_literal(w) for w in value]
        elif not isinstance(value, (tuple, list)):
            value = [value]
        return _coerce(value, want, key, example)
    if want is type(None):
        return None if stripped.lower() in ("none", "null") else _literal(stripped)
    return _coerce(_literal(stripped), want, key, example)

def set_value(root: ConfigDict, dotted: str, value: Any) -> None:
    """Set an existing key to a Python value (type-checked); dicts recurse into sections."""
    node, key = _resolve(root, dotted)
    current = node[key]
    if isinstance(current, ConfigDict):
        if isinstance(value, (dict, ConfigDict)):
            for sub_key, sub_value in value.items():
                set_value(root, f"{dotted}.{sub_key}", sub_value)
            return
        raise ConfigError(f"config key '{dotted}' is a section ({', '.join(current.keys())}); "
                          f"set one of its keys")
    if isinstance(value, ConfigDict):
        value = value.to_dict()
    value = _coerce(value, field_type(node, key), dotted, current)
    node[key] = value

def apply_override(root: ConfigDict, dotted: str, text: str) -> None:
    """`--config.<dotted>=<text>`: parse text according to the field's type, then set it."""
    node, key = _resolve(root, dotted)
    current = node[key]
    if isinstance(current, ConfigDict):
        raise ConfigError(f"config key '{dotted}' is a section ({', '.join(current.keys())}); "
                          f"override one of its keys")
    set_value(root, dotted, parse_value(text, field_type(node, key), dotted, current))

def parse_overrides(argv: Sequence[str], flag: str = "config") -> tuple[str | None, list[tuple[str, str]]]:
    """Split `--config path --config.a.b=v --config.c d` into (path, [(key, text)]).
    Arguments that are not config flags are ConfigErrors (naming the argument)."""
    path, overrides = None, []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        head = f"--{flag}"
        if not arg.startswith(head):
            raise ConfigError(f"unexpected argument '{arg}' (expected --{flag}=FILE or --{flag}.KEY=VALUE)")
        name, eq, text = arg[2:].partition("=")
        if not eq:
            # a value that looks like the next flag means this flag's value was left out
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(f"'{arg}' needs a value: write {arg}=VALUE")
            text = args[i + 1]
            i += 1
        if name == flag:
            path = text
        elif name.startswith(flag + "."):
            overrides.append((name[len(flag) + 1:], text))
        else:
            raise ConfigError(f"unexpected argument '{arg}' (expected --{flag}=FILE or --{flag}.KEY=VALUE)")
        i += 1
    return path, overrides

def _path_of(root: ConfigDict, target: ConfigDict, prefix: str = "") -> str | None:
    if root is target:
        return prefix.rstrip(".")
    for key in root.keys():
        child = root[key]
        if isinstance(child, ConfigDict):
            found = _path_of(child, target, f"{prefix}{key}.")
            if found is not None:
                return found
    return None

_CHECKS: list[Callable[[ConfigDict], None]] = []

def register_check(fn: Callable[[ConfigDict], None]) -> Callable[[ConfigDict], None]:
    """Decorator: `fn(config)` raises ConfigError when the config is inconsistent."""
    _CHECKS.append(fn)
    return fn

def to_plain(config: ConfigDict | dict) -> dict:
    """JSON-ready nested dict (tuples become lists)."""
    def plain(v):
        if isinstance(v, (ConfigDict, dict)):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, config_dict.FieldReference):
            return plain(v.get())
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return plain(config)

# leaf names whose values are credentials: config.json is shared with results, so they are masked
SECRET_KEYS = ("token", "password", "secret", "api_key")

REDACTED = "<redacted>"

def is_secret(dotted: str) -> bool:
    return dotted.split(".")[-1] in SECRET_KEYS

def redacted(tree: dict, prefix: str = "") -> dict:
    """A copy of a plain config tree with every non-empty secret value replaced by REDACTED."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out[key] = redacted(value, path + ".")
        else:
            out[key] = REDACTED if is_secret(path) and value else value
    return out

def get(config: ConfigDict, dotted: str) -> Any:
    node, key = _resolve(config, dotted)
    return node[key]


# an imported recipe key's handler: (its value, the wfm_jax {dotted key: value} being built)
Setter = Callable[[Any, dict], None]


def to_key(key: str, convert: Callable[[Any], Any] = lambda v: v) -> Setter:
    """The Setter that writes a value, converted, to one wfm_jax key (the TOML imports' tables)."""
    def set_(value, out):
        out[key] = convert(value)
    return set_
