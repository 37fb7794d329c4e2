"""Resumable training checkpoints with orbax: `dir/<step>/{state,extra,meta,data}`.

What one step holds:
  state  any pytree of arrays (params, LoRA, EMA, optimizer state, step, typed PRNG keys, ...),
         restored into the shardings the caller asks for;
  extra  a JSON dict written by process 0 (config echo, counters, anything small);
  data   this process's data-iterator state (a JSON dict), one file per process, because each
         process reads its own shard of the data;
  meta   what the wrapper needs to rebuild the state (PRNG key implementations).

Atomicity is orbax's: a step is written under `<step>.orbax-checkpoint-tmp-*` and renamed when
complete, so a killed save never shows up in `all_steps()` / `latest_step()`; leftover temp
directories are removed when the next run opens the directory.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from wfm_jax.core.console import say

_FORMAT = 1


@functools.cache  # a process-wide orbax setting: once per process
def _single_writer_arrays_on_cpu() -> None:
    """On CPU devices orbax's replica-parallel save (each replica writes a slice of a replicated
    array) slices every array eagerly per device, compiling one tiny XLA program per slice shape
    (about 110 for the tiny SD3 state, ~2 s on the first save) to split a host memcpy that one
    process writes anyway: there each array is written whole by its first replica. The files
    are the same either way (replica-parallel only picks which replica writes which chunk)."""
    if jax.default_backend() == "cpu":
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or does not fit the state this run expects."""


class Restored(NamedTuple):
    step: int
    state: Any
    extra: dict
    data_state: dict | None


# ---- per-process JSON (data-iterator state) as an orbax item ----

class ProcessJsonHandler(ocp.CheckpointHandler):
    """Every process writes and reads its own `process_<i>-of-<n>.json`."""

    @staticmethod
    def _file(directory: epath.Path) -> epath.Path:
        return directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"

    def save(self, directory: epath.Path, args: ProcessJsonSave):
        self._file(epath.Path(directory)).write_text(json.dumps(args.item))

    def restore(self, directory: epath.Path, args: ProcessJsonRestore = None):
        path = self._file(epath.Path(directory))
        if not path.exists():
            found = sorted(p.name for p in epath.Path(directory).iterdir())
            raise CheckpointError(f"no data-iterator state {path.name} in {directory} "
                                  f"(found {found}): was it saved with a different number of "
                                  f"processes?")
        return json.loads(path.read_text())


@ocp.args.register_with_handler(ProcessJsonHandler, for_save=True)
@dataclasses.dataclass
class ProcessJsonSave(ocp.args.CheckpointArgs):
    item: Any


@ocp.args.register_with_handler(ProcessJsonHandler, for_restore=True)
@dataclasses.dataclass
class ProcessJsonRestore(ocp.args.CheckpointArgs):
    pass


# ---- typed PRNG keys travel as their raw key data ----

def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(state: Any) -> tuple[Any, dict[str, str]]:
    impls: dict[str, str] = {}

    def conv(path, x):
        if _is_key(x):
            impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(x))
            return jax.random.key_data(x)
        return x

    return jax.tree_util.tree_map_with_path(conv, state), impls


def _abstract_target(abstract_state: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying a sharding for every leaf (arrays give their own)."""
    def one(x, s=None):
        sharding = s if s is not None else getattr(x, "sharding", None)
        if sharding is None:
            if jax.process_count() > 1:
                raise CheckpointError(f"no sharding for a leaf of shape {x.shape}: pass "
                                      f"shardings or abstract arrays that carry one")
            sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    if shardings is None:
        return jax.tree.map(one, abstract_state)
    return jax.tree.map(one, abstract_state, shardings)


def _key_data_target(abstract: Any, impls: dict[str, str]) -> Any:
    def conv(path, x):
        if not _is_key(x):
            return x
        name = jax.tree_util.keystr(path)
        if name not in impls:
            raise CheckpointError(f"state leaf {name} is a PRNG key here but was saved as a "
                                  f"plain array")
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=x.sharding)

    return jax.tree_util.tree_map_with_path(conv, abstract)


def _data_to_keys(restored: Any, abstract: Any, impls: dict[str, str]) -> Any:
    def conv(path, x, a):
        if _is_key(a):
            return jax.random.wrap_key_data(x, impl=impls[jax.tree_util.keystr(path)])
        return x

    return jax.tree_util.tree_map_with_path(conv, restored, abstract)


# ---- a mismatch in one line (orbax's own message dumps the whole tree) ----

def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(n.removesuffix(".value") for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_mismatch(state_dir: epath.Path, target: Any) -> str | None:
    """What differs between the saved `state` item and the target tree (ShapeDtypeStructs),
    in one line: leaves missing on either side and leaves with another shape; None when the
    names and shapes agree."""
    try:
        meta = ocp.StandardCheckpointHandler().metadata(state_dir)
    except Exception:  # unreadable metadata: orbax's restore reports it
        return None
    saved = {m.name: tuple(m.shape) for m in jax.tree.leaves(getattr(meta, "tree", meta))
             if hasattr(m, "name") and hasattr(m, "shape")}
    wanted = {name: tuple(x.shape) for name, x in ocp.tree.to_flat_dict(target, sep=".").items()
              if hasattr(x, "shape")}
    parts = []
    missing = sorted(set(wanted) - set(saved))
    if missing:
        parts.append(f"{len(missing)} leaves this run needs are not in it ({_listed(missing)})")
    only_saved = sorted(set(saved) - set(wanted))
    if only_saved:
        parts.append(f"{len(only_saved)} saved leaves this run does not have "
                     f"({_listed(only_saved)})")
    reshaped = [n for n in sorted(set(saved) & set(wanted)) if saved[n] != wanted[n]]
    if reshaped:
        first = reshaped[0]
        parts.append(f"{len(reshaped)} leaves have another shape ({_listed(reshaped)}; "
                     f"{first.removesuffix('.value')}: saved {saved[first]}, this run "
                     f"{wanted[first]})")
    return "; ".join(parts) or None


# ---- the manager ----

class Checkpointer:
    """`ocp.CheckpointManager` for train state + JSON extras + per-process data state.

    save_freq: `save(step, ...)` writes when step % save_freq == 0 (0: only with force=True).
    max_keep: newest checkpoints kept (None or 0: keep all). async_: writes continue in the
    background after `save` returns (arrays are copied off the devices first, so the caller
    may donate or delete them); `wait()` blocks until the last save is final.
    """

    def __init__(self, directory, max_keep: int | None = None, save_freq: int = 1,
                 async_: bool = True):
        self.directory = epath.Path(os.path.abspath(directory))  # orbax needs absolute paths
        self.save_freq = int(save_freq or 0)
        self._async = bool(async_)
        self._max_keep = max_keep if max_keep and max_keep > 0 else None
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self._max_keep,
            enable_async_checkpointing=async_,
            cleanup_tmp_directories=True,
        )
        self._mgr = ocp.CheckpointManager(self.directory, options=options)
        _single_writer_arrays_on_cpu()

    # -- queries --
    def all_steps(self) -> list[int]:
        return list(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def removed_by_saving(self, step: int) -> list[int]:
        """The old steps max_keep deletes when `step` is saved. Waits for a background save
        first (the save itself would), so that the step it writes is counted."""
        keep = self._max_keep
        if keep:
            self._mgr.wait_until_finished()
        return sorted(self.all_steps() + [int(step)])[:-keep] if keep else []

    def should_save(self, step: int) -> bool:
        return self.save_freq > 0 and step > 0 and step % self.save_freq == 0

    # -- save --
    def save(self, step: int, state: Any, extra: dict | None = None,
             data_state: dict | None = None, force: bool = False) -> bool:
        """Save if `should_save(step)` or `force`; returns whether a save started."""
        step = int(step)
        if not (force or self.should_save(step)):
            return False
        if step in self._mgr.all_steps():
            raise CheckpointError(f"checkpoint step {step} already exists in {self.directory}; "
                                  f"resume from it or use a new output directory")
        extra = dict(extra or {})
        for name, item in (("extra", extra), ("data_state", data_state)):
            try:
                json.dumps(item)
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"checkpoint {name} is not JSON-serialisable: {e}") from None
        savable, impls = _keys_to_data(state)
        items = dict(state=ocp.args.StandardSave(savable),
                     meta=ocp.args.JsonSave({"format": _FORMAT, "prng_impls": impls}),
                     extra=ocp.args.JsonSave(extra))
        if data_state is not None:
            items["data"] = ProcessJsonSave(data_state)
        removed = self.removed_by_saving(step)
        started = bool(self._mgr.save(step, args=ocp.args.Composite(**items), force=True))
        if started:
            self._say_saved(step, removed)
        return started

    def _say_saved(self, step: int, removed: list[int]) -> None:
        """One console line: the save and the old steps max_keep removes with it (orbax drops
        them silently, in the background when async)."""
        keep = self._max_keep
        how = "saving (in the background)" if self._async else "saved"
        line = f"checkpoint step {step} {how} in {self.directory}/{step}"
        if removed:
            line += (f"; removing step{'s' if len(removed) > 1 else ''} "
                     f"{', '.join(map(str, removed))} (train.ckpt.max_keep={keep})")
        say(line)

    # -- restore --
    def restore(self, step: int, abstract_state: Any, shardings: Any = None) -> Restored:
        """Restore `step` into the structure, dtypes and shardings of `abstract_state`
        (arrays or ShapeDtypeStructs; `shardings`, a matching pytree, overrides theirs)."""
        step = int(step)
        if step not in self._mgr.all_steps():
            raise CheckpointError(f"no finalized checkpoint step {step} in {self.directory} "
                                  f"(have {self.all_steps()})")
        step_dir = self.directory / str(step)
        meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        impls = meta.get("prng_impls", {})
        abstract = _abstract_target(abstract_state, shardings)
        target = _key_data_target(abstract, impls)
        differs = describe_mismatch(step_dir / "state", target)
        if differs:
            raise CheckpointError(f"checkpoint {step_dir} does not match the state this run "
                                  f"expects (was it written with another model or config, e.g. "
                                  f"LoRA, EMA or the algorithm?): {differs}")
        items = dict(state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore())
        has_data = (step_dir / "data").exists()
        if has_data:
            items["data"] = ProcessJsonRestore()
        try:
            out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        except CheckpointError:
            raise
        except Exception as e:  # orbax raises many types; its first line, not its tree dump
            first = (str(e).strip().splitlines() or [""])[0]
            raise CheckpointError(f"checkpoint {step_dir} cannot be restored into the state "
                                  f"this run expects: {type(e).__name__}: {first}") from e
        state = _data_to_keys(out["state"], abstract, impls)
        return Restored(step, state, dict(out["extra"] or {}),
                        out["data"] if has_data else None)

    def restore_latest(self, abstract_state: Any, shardings: Any = None) -> Restored | None:
        """The newest finalized checkpoint, or None when there is none."""
        step = self.latest_step()
        if step is None:
            return None
        return self.restore(step, abstract_state, shardings)

    # -- lifecycle --
    def wait(self) -> None:
        self._mgr.wait_until_finished()

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def abstract_of(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a concrete pytree, e.g. to restore into the
    layout of a freshly initialised state without keeping its buffers."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None)),
        tree)
