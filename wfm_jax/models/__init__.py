"""The networks, one folder per model (nnx modules only: no loading, no training).

`wfm_jax.models.load_transformer(path)` and `wfm_jax.models.export_diffusers(...)` are the
documented notebook entry points; they are implemented in `converters.loading` (a layer above the
networks) and resolved here on first use, so importing a network never imports the converters.
"""
from __future__ import annotations

import importlib

_FROM_CONVERTERS = ("load_transformer", "export_diffusers")


def __getattr__(name: str):
    if name in _FROM_CONVERTERS:
        return getattr(importlib.import_module("converters.loading"), name)
    raise AttributeError(f"module 'wfm_jax.models' has no attribute {name!r}")
