"""Name -> thing tables with every entry written in one place, loaded on first use.

An entry is the thing itself or a "package.module:attr" string naming it; a string is imported
only when its name is looked up, so importing a registry imports none of its entries (and no
entry registers itself by an import side effect: big_vision's pattern). Lookups of unknown names
raise one `UserError` line with the nearest name and the known ones. No jax here: the reward
server's registry is one of these.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from wfm_jax.core.errors import UserError

T = TypeVar("T")


def resolve(reference: str) -> object:
    """The object a "package.module:attr.sub" string names (ImportError/AttributeError if none)."""
    module, sep, attr = reference.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"registry entry {reference!r} is not of the form 'package.module:attr'")
    value: object = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    """kind: what an entry is, for messages ("model family"); entries: name -> T or a lazy
    "module:attr" reference to one (a str entry is always a reference)."""

    def __init__(self, kind: str, entries: Mapping[str, str | T]) -> None:
        self.kind = kind
        self._entries: dict[str, str | T] = dict(entries)
        self._loaded: dict[str, T] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The registered names, sorted; loads nothing."""
        return sorted(self._entries)

    def reference(self, name: str) -> str | None:
        """The "module:attr" string of a lazy entry (None for one registered as an object)."""
        entry = self._entries.get(name)
        return entry if isinstance(entry, str) else None

    def closest(self, name: str) -> str | None:
        """The registered name nearest to `name`, if any is close."""
        close = difflib.get_close_matches(str(name), self.names(), n=1, cutoff=0.6)
        return close[0] if close else None

    def unknown(self, name: str) -> str:
        """The one-line message for a name that is not registered."""
        hint = self.closest(name)
        hint = f"; did you mean {hint!r}?" if hint else ";"
        return f"unknown {self.kind} {name!r}{hint} known: {', '.join(self.names()) or '(none)'}"

    def get(self, name: str) -> T:
        """The entry `name` (imported on first use); UserError naming the known ones if absent."""
        if name in self._loaded:
            return self._loaded[name]
        if name not in self._entries:
            raise UserError(self.unknown(name))
        entry = self._entries[name]
        value: T = resolve(entry) if isinstance(entry, str) else entry  # type: ignore[assignment]
        self._loaded[name] = value
        return value

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) for every name, each entry loaded."""
        return [(name, self.get(name)) for name in self.names()]

    def values(self) -> list[T]:
        return [value for _, value in self.items()]

    def register(self, name: str, value: str | T, *, replace: bool = False) -> str | T:
        """Add an entry (tests, users' own families); a taken name needs replace=True."""
        if name in self._entries and not replace:
            raise UserError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = value
        self._loaded.pop(name, None)
        return value

    def unregister(self, name: str) -> None:
        """Drop an entry (the undo of `register`); unknown names are a UserError."""
        if name not in self._entries:
            raise UserError(self.unknown(name))
        del self._entries[name]
        self._loaded.pop(name, None)
