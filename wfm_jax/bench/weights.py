"""Identical random weights for both stacks: one seeded numpy state dict in diffusers layout.

The torch stack loads it into the diffusers module; the wfm_jax stack converts it through the
converter table (the same path a real checkpoint takes), so both compute the same function.
Weights are drawn, not default-initialised: diffusers zero-initialises the adaLN and output
layers, which would make the outputs (and the loss) trivially equal.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time

import numpy as np

_CLASSES = {"transformer": "SD3Transformer2DModel", "vae": "AutoencoderKL"}
POOL = 1 << 24
WEIGHTS_CACHE_ENV = "WFM_JAX_BENCH_WEIGHTS"  # a directory: converted weights kept across processes


def class_name(kind: str) -> str:
    """"transformer" / "vae" (the SD3 pair) or a diffusers class name itself."""
    return _CLASSES.get(kind, kind)


def diffusers_class(kind: str):
    import diffusers
    return getattr(diffusers, class_name(kind))


def _meta_module(kind: str, config: dict):
    import torch
    with torch.device("meta"):  # shapes only: no memory, no init time
        return diffusers_class(kind)(**config)


@functools.lru_cache(maxsize=4)
def _state_dict(kind: str, config_json: str, seed: int) -> dict[str, np.ndarray]:
    module = _meta_module(kind, json.loads(config_json))
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    rng = np.random.default_rng(seed)
    # Every tensor is a slice of one pool of normals (cyclic beyond the pool size): SD3.5-Medium's
    # 2.5e9 values then cost a copy instead of a minute of random draws per process.
    pool = rng.standard_normal(POOL, dtype=np.float32)
    out = {}
    for key in sorted(shapes):
        shape = shapes[key]
        n = math.prod(shape)
        if n <= POOL:
            start = int(rng.integers(0, POOL - n + 1))
            x = pool[start:start + n].reshape(shape).copy()
        else:
            x = np.resize(pool, n).reshape(shape)
        if len(shape) >= 2 and not key.endswith("pos_embed"):
            x *= 1.0 / math.sqrt(math.prod(shape[1:]))  # fan-in scaling keeps activations O(1)
        elif key.endswith(".weight"):  # norm scales
            x = 1.0 + 0.02 * x
        else:  # biases and the position table
            x *= 0.02
        x.setflags(write=False)  # cached and shared by every build: nobody may train it in place
        out[key] = x
    return out


def random_state_dict(kind: str, config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """diffusers key -> fp32 array for a `kind` ("transformer" | "vae" | a diffusers class name)
    built from `config`."""
    return _state_dict(kind, json.dumps(config, sort_keys=True, default=list), seed)


def torch_module(kind: str, config: dict, device, dtype, seed: int = 0):
    """The diffusers module holding `random_state_dict`, on `device` in `dtype`."""
    import torch
    from diffusers.utils import logging
    module = _meta_module(kind, config)
    # a copy: the torch module trains its tensors in place, the cached arrays must stay initial
    state = {k: torch.from_numpy(v.copy())
             for k, v in random_state_dict(kind, config, seed).items()}
    module.load_state_dict(state, strict=True, assign=True)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # .to(dtype) warns about from_pretrained's fp32-module list
    try:
        return module.to(device=device, dtype=dtype)
    finally:
        logging.set_verbosity(verbosity)


def jax_module(kind: str, config: dict, *, dtype, param_dtype, seed: int = 0, **options):
    """The wfm_jax module holding `random_state_dict`, converted by the model's mapping table and
    placed on the first local device (built abstract first: no throw-away initialisation)."""
    import jax
    from flax import nnx

    from converters.registry import spec_for
    from converters.table import convert_to_jax
    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.core.tree import flat_shapes, path_str

    cfg = dict(config, _class_name=class_name(kind))
    spec = spec_for(cfg)
    model = abstract_module(lambda: spec.make_model(config, dtype=dtype, param_dtype=param_dtype,
                                                    rngs=nnx.Rngs(0), **options))
    from wfm_jax.bench.timing import progress
    shapes = flat_shapes(model)
    where = _cache_dir(kind, config, seed, shapes)
    flat = _load_converted(where) if where else None
    if flat is not None:
        progress(f"{kind}: converted weights read from {where}")
    else:
        start = time.perf_counter()
        state = random_state_dict(kind, config, seed)
        progress(f"{kind}: random state dict in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        flat = convert_to_jax(spec.build_table(config),
                              {k: (lambda v=v: v) for k, v in state.items()}, shapes)
        progress(f"{kind}: converted in {time.perf_counter() - start:.1f} s")
        if where:
            _store_converted(where, flat)
    start = time.perf_counter()
    device = jax.local_devices()[0]
    variables = {path_str(p): v for p, v in nnx.state(model, nnx.Variable).flat_state()}
    for path, value in flat.items():
        var = variables.pop(path)
        var.set_value(jax.device_put(value.astype(var.dtype, copy=False), device))
    progress(f"{kind}: placed on {device.platform} in {time.perf_counter() - start:.1f} s")
    if variables:  # nothing but table-mapped parameters may exist: fail rather than time garbage
        raise ValueError(f"{class_name(kind)}: variables without weights: {sorted(variables)[:8]}")
    return model


def _cache_dir(kind: str, config: dict, seed: int, shapes: dict[str, tuple]) -> str | None:
    """Where $WFM_JAX_BENCH_WEIGHTS keeps this module's converted weights (None: unset). A GPU
    lease runs each part in its own process, and SD3.5-M's 2.2e9 random values cost each of them
    35-40 s to draw and convert before anything is timed (2026-11-28); read back from the page
    cache they cost seconds. Keyed by everything the values depend on."""
    root = os.environ.get(WEIGHTS_CACHE_ENV)
    if not root:
        return None
    key = json.dumps([class_name(kind), config, seed, POOL, sorted(shapes.items())],
                     sort_keys=True, default=list)
    return os.path.join(root, f"{class_name(kind)}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def _load_converted(where: str) -> dict[str, np.ndarray] | None:
    try:
        with open(os.path.join(where, "index.json")) as f:
            index = json.load(f)
        return {path: np.load(os.path.join(where, name), mmap_mode="r")
                for path, name in index.items()}
    except (OSError, ValueError):  # absent, or not written whole: draw again
        return None


def _store_converted(where: str, flat: dict[str, np.ndarray]) -> None:
    """One .npy per array and an index, built beside `where` and renamed into place whole
    (io.atomic.atomic_directory, which also replaces a torn entry). A cache that cannot be
    written is one line; the run goes on."""
    from wfm_jax.bench.timing import progress
    from wfm_jax.io.atomic import atomic_directory
    try:
        with atomic_directory(where) as tmp:
            index = {}
            for i, (path, value) in enumerate(sorted(flat.items())):
                index[path] = f"{i}.npy"
                np.save(os.path.join(tmp, index[path]), np.asarray(value))
            with open(os.path.join(tmp, "index.json"), "w") as f:
                json.dump(index, f)
    except OSError as e:
        progress(f"weights cache not written at {where}: {e}")


def lora_a(paths_and_fan_in: dict[str, int], rank: int, seed: int = 3) -> dict[str, np.ndarray]:
    """LoRA down-projections A (fan_in, rank) ~ N(0, 1/rank) (peft's "gaussian" init) for both
    stacks; the up-projections B start at zero in both."""
    rng = np.random.default_rng(seed)
    return {p: rng.standard_normal((n, rank), dtype=np.float32) / rank
            for p, n in sorted(paths_and_fan_in.items())}
