"""The planner's on-disk cache of what compiling a program told it (compile_program's result:
bytes, FLOPs, the cost model's seconds, the HLO's loops, or the compiler's refusal).

A TPU compile of a video recipe's VAE decode takes 2-3 minutes on 2 cores whatever the
transformer does, and a re-plan after changing a remat policy, a batch or a flag compiles every
unchanged program again. JAX's own persistent compilation cache does not help here: it writes
executables compiled for a topology without a TPU but does not load them back (measured with
jax 0.10.2 and libtpu: the second compile took as long as the first). What the planner needs is
the analysis, not the executable, so that is what is kept, one JSON file per program.

The key is a hash of everything the analysis depends on: the lowered module's text (the
computation, its shapes and shardings), the target devices (platform, kind, mesh), the compiler
options and the XLA / libtpu flags of the environment, the versions of jax, jaxlib and libtpu,
and the source of the code that reads the compiled program. A change to any of them is a miss.

Where: --cache-dir, else $WFM_JAX_PLAN_CACHE, else $XDG_CACHE_HOME/wfm_jax/plan (~/.cache/...);
--no-cache or WFM_JAX_PLAN_CACHE=off turns it off.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os

from wfm_jax.io.atomic import write_text_atomic

CACHE_ENV = "WFM_JAX_PLAN_CACHE"
OFF = ("", "off", "0", "none")
FORMAT = 1  # bump when what an entry holds changes shape
# the code that turns a compiled program into the cached result: a change to it is a miss
_READERS = ("programs/stats.py", "plan/hlo_cost.py", "plan/topology.py", "plan/stats_cache.py")


def default_dir() -> str | None:
    """$WFM_JAX_PLAN_CACHE (off: None), else $XDG_CACHE_HOME/wfm_jax/plan."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wfm_jax", "plan")


def cache_for(args) -> StatsCache | None:
    """The plan's cache: --no-cache: None; --cache-dir, else default_dir()."""
    if getattr(args, "no_cache", False):
        return None
    directory = getattr(args, "cache_dir", None) or default_dir()
    return StatsCache(directory) if directory else None


@functools.cache
def _versions() -> str:
    from importlib import metadata
    out = []
    for dist in ("jax", "jaxlib", "libtpu"):
        try:
            out.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{dist}=none")
    return " ".join(out)


@functools.cache
def _readers_digest() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for name in _READERS:
        with open(os.path.join(root, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


class StatsCache:
    """get / put of compile_program results under key(lowering, analyzed)."""

    def __init__(self, directory: str):
        self.directory = directory

    def key(self, lowering, analyzed: bool) -> str:
        """The hash of what the compiled program's analysis depends on (module docstring).
        analyzed: whether the optimized HLO was read (plan/topology.hlo_reader)."""
        devices = list(lowering.mesh.devices.flat)
        device = devices[0]
        # which devices, in mesh order (where the collectives run on the topology)
        placement = [(d.id, getattr(d, "coords", None), getattr(d, "slice_index", None))
                     for d in devices]
        parts = [f"format {FORMAT}", _versions(), _readers_digest(),
                 f"{device.platform} {getattr(device, 'device_kind', '')}",
                 f"mesh {dict(lowering.mesh.shape)}", f"devices {placement}",
                 f"options {sorted((lowering.options or {}).items())}",
                 f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
                 f"LIBTPU_INIT_ARGS {os.environ.get('LIBTPU_INIT_ARGS', '')}",
                 f"analyzed {analyzed}", lowering.text]
        h = hashlib.sha256()
        for part in parts:
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.json")

    def get(self, key: str) -> dict | None:
        """The stored result, or None (absent, or unreadable: a torn or foreign file is a miss
        and is written over)."""
        try:
            with open(self._path(key)) as f:
                entry = json.load(f)
            result = entry["result"] if entry.get("format") == FORMAT else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            result = None
        return result if isinstance(result, dict) else None

    def put(self, key: str, result: dict) -> None:
        """Store `result` whole or not at all (written to a temporary, renamed into place). A
        cache that cannot be written is no reason to fail the plan."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_text_atomic(self._path(key), json.dumps({"format": FORMAT, "result": result}))
        except (OSError, TypeError, ValueError) as e:  # said, not fatal: the figures are printed
            import sys
            print(f"wfm_jax.plan: not kept in the plan cache {self.directory}: {e}", file=sys.stderr)
