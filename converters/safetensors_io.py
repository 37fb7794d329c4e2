"""Lazy, tensor-by-tensor safetensors reading and sharded writing (numpy; bf16 via ml_dtypes).

Nothing here materialises a whole checkpoint: `open_checkpoint` returns key -> loader, and each
loader reads one tensor in its stored dtype (a bf16 checkpoint stays bf16 in host memory).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator

import ml_dtypes  # noqa: F401  registers "bfloat16" with numpy: safetensors' numpy reader needs it
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

WEIGHT_NAMES = ("diffusion_pytorch_model", "model")


def _find_weights(directory: str) -> tuple[list[str], str]:
    """Return (safetensors files, description) for a diffusers/transformers weights dir."""
    for stem in WEIGHT_NAMES:
        index = os.path.join(directory, f"{stem}.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted({os.path.join(directory, v) for v in weight_map.values()})
            return files, index
        single = os.path.join(directory, f"{stem}.safetensors")
        if os.path.isfile(single):
            return [single], single
    raise FileNotFoundError(f"no *.safetensors weights (or index) in {directory}")


def open_checkpoint(path: str) -> dict[str, Callable[[], np.ndarray]]:
    """path: a .safetensors file or a directory holding one (or a sharded index)."""
    files = [path] if os.path.isfile(path) else _find_weights(path)[0]
    loaders: dict[str, Callable[[], np.ndarray]] = {}
    for file in files:
        with safe_open(file, framework="numpy") as f:
            for key in f.keys():
                if key in loaders:
                    raise ValueError(f"tensor {key} appears in more than one shard of {path}")
                loaders[key] = (lambda file=file, key=key: _read(file, key))
    return loaders


def _read(file: str, key: str) -> np.ndarray:
    with safe_open(file, framework="numpy") as f:
        return f.get_tensor(key)


@contextlib.contextmanager
def open_checkpoint_slices(path: str) -> Iterator[dict[str, Callable[[tuple], np.ndarray]]]:
    """key -> read(index): the elements `index` (a tuple of slices, () for all) selects of one
    tensor, in its stored dtype; only those bytes are copied out of the file. Files stay open
    for the `with` block."""
    files = [path] if os.path.isfile(path) else _find_weights(path)[0]
    readers: dict[str, Callable[[tuple], np.ndarray]] = {}
    with contextlib.ExitStack() as stack:
        for file in files:
            handle = stack.enter_context(safe_open(file, framework="numpy"))
            for key in handle.keys():
                if key in readers:
                    raise ValueError(f"tensor {key} appears in more than one shard of {path}")
                readers[key] = functools.partial(_read_slice, handle, key)
        yield readers


def _read_slice(handle, key: str, index: tuple) -> np.ndarray:
    return handle.get_slice(key)[index]


def save_checkpoint(tensors: dict[str, np.ndarray], directory: str,
                    stem: str = "diffusion_pytorch_model", max_shard_bytes: int = 5 << 30) -> None:
    """Write tensors as one file, or as shards plus a diffusers-style index when large."""
    os.makedirs(directory, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key in sorted(tensors):
        arr = np.ascontiguousarray(tensors[key])
        if shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = arr
        size += arr.nbytes
    if len(shards) == 1:
        save_file(shards[0], os.path.join(directory, f"{stem}.safetensors"))
        return
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        name = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(directory, name))
        for key, arr in shard.items():
            weight_map[key] = name
            total += arr.nbytes
    with open(os.path.join(directory, f"{stem}.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def checkpoint_meta(path: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """key -> (shape, safetensors dtype name) from the file headers only; no tensor is read."""
    files = [path] if os.path.isfile(path) else _find_weights(path)[0]
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in files:
        with safe_open(file, framework="numpy") as f:
            for key in f.keys():
                piece = f.get_slice(key)
                meta[key] = (tuple(piece.get_shape()), piece.get_dtype())
    return meta


def save_checkpoint_streaming(nbytes: dict[str, int],
                              load_many: Callable[[list[str]], dict[str, np.ndarray]],
                              directory: str, stem: str = "diffusion_pytorch_model",
                              max_shard_bytes: int = 2 << 30) -> None:
    """Like `save_checkpoint`, but only one shard's tensors are in host memory at a time.

    nbytes: key -> tensor size, used to plan the shards; load_many(keys) returns those tensors.
    """
    os.makedirs(directory, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for key in sorted(nbytes):
        if shards[-1] and size + nbytes[key] > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes[key]
    if len(shards) == 1:
        tensors = load_many(shards[0])
        save_file({k: np.ascontiguousarray(tensors[k]) for k in shards[0]},
                  os.path.join(directory, f"{stem}.safetensors"))
        return
    weight_map = {}
    for i, keys in enumerate(shards):
        name = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = load_many(keys)
        save_file({k: np.ascontiguousarray(tensors[k]) for k in keys}, os.path.join(directory, name))
        del tensors
        weight_map.update(dict.fromkeys(keys, name))
    with open(os.path.join(directory, f"{stem}.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map},
                  f, indent=2)
