"""The wfm_jax state on disk: an orbax checkpoint of dotted path -> array plus the model's config.

Layout of a state directory:

    config.json   the diffusers/transformers config the model is built from (its `_class_name`)
    params/       orbax checkpoint of the parameters, nested by the dotted path's parts

Arrays keep their dtype (bf16 included). Saving is incremental (orbax partial saves, one group of
tensors at a time), so a conversion never holds the whole checkpoint in host memory; the whole
directory appears at once (temporary sibling, then rename). This is a single-controller format
(conversion, export, inspection); multi-process training checkpoints belong to train/checkpoint.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping

import jax
import numpy as np

from wfm_jax.io.atomic import atomic_directory

CONFIG_NAME = "config.json"
PARAMS_DIR = "params"


def _ocp():
    import orbax.checkpoint.experimental.v1 as ocp  # heavy: only when a state is read or written
    return ocp


def is_state_dir(path: str) -> bool:
    return os.path.isdir(os.path.join(path, PARAMS_DIR)) and os.path.isfile(
        os.path.join(path, CONFIG_NAME))


def nest(flat: Mapping[str, object]) -> dict:
    """{"a.0.w": x} -> {"a": {"0": {"w": x}}}."""
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def flatten(tree: Mapping, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _groups(nbytes: Mapping[str, int], limit: int) -> Iterable[list[str]]:
    group, size = [], 0
    for key in nbytes:
        if group and size + nbytes[key] > limit:
            yield group
            group, size = [], 0
        group.append(key)
        size += nbytes[key]
    if group:
        yield group


def write_config(config: Mapping, directory: str) -> None:
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump(dict(config), f, indent=2, sort_keys=True)
        f.write("\n")


# Storage chunk bound. Without it a host (numpy) array is stored as ONE chunk, and restoring any
# shard of it decompresses the whole array on every process; with it a process restoring its
# shards reads only the chunks they overlap.
CHUNK_BYTES = 4 << 20


def _chunked(ocp, chunk_bytes: int):
    saving = ocp.options.ArrayOptions.Saving
    return ocp.Context(array_options=ocp.options.ArrayOptions(saving=saving(
        storage_options=saving.StorageOptions(chunk_byte_size=chunk_bytes))))


def save_state_streaming(nbytes: Mapping[str, int],
                         load_many: Callable[[list[str]], Mapping[str, object]],
                         config: Mapping, dst: str, group_bytes: int = 1 << 30,
                         chunk_bytes: int = CHUNK_BYTES) -> None:
    """Write a state directory; load_many(paths) yields only about `group_bytes` at a time.

    nbytes: dotted path -> tensor size (plans the groups); values may be numpy or jax arrays.
    Arrays are stored in chunks of at most `chunk_bytes`.
    """
    ocp = _ocp()
    with atomic_directory(dst) as tmp, _chunked(ocp, chunk_bytes):
        target = os.path.join(tmp, PARAMS_DIR)
        for keys in _groups(nbytes, group_bytes):
            arrays = load_many(keys)
            ocp.partial.save(target, nest({k: arrays[k] for k in keys}))
            del arrays
        ocp.partial.finalize(target)
        write_config(config, tmp)


def save_state(flat: Mapping[str, object], config: Mapping, dst: str,
               chunk_bytes: int = CHUNK_BYTES) -> None:
    """Write an in-memory state (numpy or jax arrays, sharded arrays included) in one go."""
    save_state_streaming(dict.fromkeys(flat, 0), lambda keys: {k: flat[k] for k in keys}, config,
                         dst, group_bytes=1, chunk_bytes=chunk_bytes)  # size 0 -> one group


def chunk_shapes(src: str) -> dict[str, tuple[int, ...]]:
    """dotted path -> the shape of the chunks it is stored in (the unit a restore reads)."""
    tree = _ocp().metadata(os.path.join(src, PARAMS_DIR)).metadata
    return {k: tuple(m.storage_metadata.chunk_shape) for k, m in flatten(tree).items()}


def read_config(src: str) -> dict:
    with open(os.path.join(src, CONFIG_NAME)) as f:
        return json.load(f)


def state_meta(src: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """dotted path -> (shape, dtype) from the checkpoint's metadata only."""
    tree = _ocp().metadata(os.path.join(src, PARAMS_DIR)).metadata
    return {k: (tuple(m.shape), np.dtype(m.dtype)) for k, m in flatten(tree).items()}


def restore_state(src: str, keys: Iterable[str] | None = None,
                  shardings: Mapping[str, jax.sharding.Sharding] | None = None,
                  dtypes: Mapping[str, object] | None = None) -> dict[str, object]:
    """Read a state (or only `keys`) as dotted path -> array.

    Without shardings the arrays come back as host numpy in their stored dtype; with shardings
    (path -> Sharding) each comes back as a jax.Array placed straight into its shards. `dtypes`
    (path -> dtype) casts while reading.
    """
    ocp = _ocp()
    meta = state_meta(src)
    wanted = set(meta) if keys is None else set(keys)
    unknown = wanted - set(meta)
    if unknown:
        raise KeyError(f"state {src} lacks {sorted(unknown)[:8]}")
    abstract = {}
    for path, (shape, dtype) in meta.items():
        if path not in wanted:
            abstract[path] = ocp.PLACEHOLDER
            continue
        dtype = np.dtype(dtypes[path]) if dtypes and path in dtypes else dtype
        if shardings is not None:
            abstract[path] = jax.ShapeDtypeStruct(shape, dtype, sharding=shardings[path])
        else:
            abstract[path] = np.empty(shape, dtype)  # only a template: pages are never touched
    restored = flatten(ocp.load(os.path.join(src, PARAMS_DIR), nest(abstract)))
    return {k: v for k, v in restored.items() if k in wanted}
