"""Load registered models straight into their shards, and export them back to diffusers.

Loading never builds the model on one device and never holds the checkpoint in host memory:

    config.json -> ModelSpec (converters.registry) -> nnx.eval_shape(make_model) -> shardings
    -> for each table rule and each distinct shard this process addresses: read only that
       shard's slice of the stored tensor, transform, cast, put it on its device(s)
    -> fill the abstract model's variables.

So on a pod each process reads its own part of every sharded tensor, once (replicas on several
local devices share one read). Every transform in converters.table is an axis permutation, so a
shard's slice maps back to one slice of the stored layout; a transform that is not would be read
whole (per process) and cut. Host memory is always the shards'; disk reads follow the file's pages,
so a slice that is strided in the stored layout (a torch Linear split on its input axis, e.g.
q/k/v under fsdp) still pulls most of the tensor's pages, a row block only its own.

Every key/shape problem that the file headers reveal is raised (ConversionError naming the keys)
before any tensor is read or any device is touched.
"""
from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from converters import registry
from converters.safetensors_io import checkpoint_meta, open_checkpoint_slices, save_checkpoint_streaming
from converters.table import TRANSFORMS, ConversionError, Rule, check_keys, to_diffusers_tensor, to_jax_tensor
from converters.tied import StoredKeys, resolve_tied, tied_reader
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_params, path_str
from wfm_jax.io.atomic import atomic_directory

_PROBE = (2, 3, 5, 7, 11, 13)  # distinct sizes reveal how a transform permutes axes


def name_list(names, n: int = 8) -> str:
    """The first n names, sorted, and how many more: error messages stay one readable line."""
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


# ----------------------------------------------------------------------------- directories

def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def resolve_model_dir(path: str, component: str = "transformer") -> str:
    """A model dir as is; a pipeline dir (model_index.json) -> its `component` subfolder."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such model directory: {path}")
    index = os.path.join(path, "model_index.json")
    if os.path.isfile(index):
        pipeline = read_json(index)
        name = pipeline.get("_class_name", "<no _class_name>")
        if component not in pipeline or not os.path.isdir(os.path.join(path, component)):
            raise ValueError(f"pipeline {name} in {path} has no {component!r} component")
        path = os.path.join(path, component)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"no config.json in {path}")
    return path


def abstract_model(spec: registry.ModelSpec, config: dict, dtype=None, param_dtype=jnp.float32,
                   **options):
    """The model with ShapeDtypeStructs for values: shapes, dtypes and logical axes, no memory."""
    return abstract_module(lambda: spec.make_model(config, dtype=dtype, param_dtype=param_dtype,
                                                   rngs=nnx.Rngs(0), **options))


# ----------------------------------------------------------------------------- checks

@functools.cache
def axis_permutation(transform: str, ndim: int) -> tuple[int, ...] | None:
    """perm with transformed axis i = stored axis perm[i]; None when the transform is not a pure
    axis permutation (then a slice of its output has no single slice of its input)."""
    if transform == "identity":
        return tuple(range(ndim))
    if ndim > len(_PROBE):
        return None
    x = np.arange(math.prod(_PROBE[:ndim]), dtype=np.int32).reshape(_PROBE[:ndim])
    y = TRANSFORMS[transform][0](x)
    if sorted(y.shape) != sorted(x.shape):
        return None
    perm = tuple(x.shape.index(d) for d in y.shape)
    return perm if np.array_equal(y, np.transpose(x, perm)) else None


def _jax_shape(rule: Rule, hf_shape: tuple) -> tuple | None:
    """Shape a tensor takes after the rule's transform, from its shape alone (None if unknown)."""
    perm = axis_permutation(rule.transform, len(hf_shape))
    if perm is None:  # not a pure permutation: shape checked after reading
        return None
    return tuple(hf_shape[p] for p in perm)


def all_variables(model) -> dict[str, nnx.Variable]:
    return {path_str(p): v for p, v in nnx.state(model, nnx.Variable).flat_state()}


def check_against_model(table: list[Rule], meta: Mapping[str, tuple], model) -> None:
    """Keys and shapes of a checkpoint (key -> (shape, dtype)) against the (abstract) model."""
    check_keys(table, meta.keys())
    variables = all_variables(model)
    unknown = {r.jax for r in table} - set(variables)
    if unknown:
        raise ConversionError(f"mapping table names paths the model lacks: {name_list(unknown)}")
    unmapped = set(flat_params(model)) - {r.jax for r in table}
    if unmapped:
        raise ConversionError(f"model parameters with no mapping: {name_list(unmapped)}")
    wrong = []
    for rule in table:
        shape = _jax_shape(rule, meta[rule.hf][0])
        want = tuple(variables[rule.jax].shape)
        if shape is not None and shape != want:
            wrong.append(f"{rule.hf} {tuple(meta[rule.hf][0])} (model {rule.jax} {want})")
    if wrong:
        raise ConversionError(f"wrong shape for {len(wrong)} key(s): {name_list(wrong)}")


# ----------------------------------------------------------------------------- placement

def _full_index(index: tuple, shape: tuple) -> tuple[slice, ...]:
    """A shard index (tuple of slices, possibly open or short) with explicit bounds per axis."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(slice(*s.indices(n)) for s, n in zip(index, shape))


def checkpoint_index(perm: tuple[int, ...], index: tuple, jax_shape: tuple) -> tuple[slice, ...]:
    """The slices of the stored tensor that hold what `index` picks of the transformed one."""
    full = _full_index(index, jax_shape)
    out = [slice(None)] * len(perm)
    for axis, src in enumerate(perm):
        out[src] = full[axis]
    return tuple(out)


def plan_reads(perm: tuple[int, ...] | None, device_indices: Mapping, jax_shape: tuple
               ) -> list[tuple[tuple, tuple, list]]:
    """(stored-layout index, jax index, devices) per distinct shard in `device_indices` (a
    sharding's device -> index map, e.g. the part this process addresses): replicas share one
    read. perm None (not a permutation): the stored index is () — the whole tensor."""
    plan: dict[tuple, tuple[tuple, tuple, list]] = {}
    for device, index in device_indices.items():
        full = _full_index(index, jax_shape)
        key = tuple((s.start, s.stop, s.step) for s in full)  # slices are unhashable in 3.11
        if key not in plan:
            plan[key] = (() if perm is None else checkpoint_index(perm, full, jax_shape), full, [])
        plan[key][2].append(device)
    return list(plan.values())


def load_tensor(read: Callable[[tuple], np.ndarray], rule: Rule, shape: tuple, dtype,
                sharding: jax.sharding.Sharding) -> jax.Array:
    """One table tensor into the shards this process addresses; read(index) gives a slice of
    the stored tensor. Each distinct shard's slice is read once, transformed and cast."""
    shape = tuple(shape)
    perm = axis_permutation(rule.transform, len(shape))
    plan = plan_reads(perm, sharding.addressable_devices_indices_map(shape), shape)
    if perm is None:  # read whole, transform, then cut the shards
        whole = to_jax_tensor(rule, read(()), shape)
    forward = TRANSFORMS[rule.transform][0]
    arrays = []
    for stored_index, index, devices in plan:
        piece = whole[index] if perm is None else forward(read(stored_index))
        want = tuple(s.stop - s.start for s in index)
        if piece.shape != want:  # headers were checked; a file that lies about shapes lands here
            raise ConversionError(f"{rule.hf}: read {piece.shape} for shard {want} of {rule.jax}")
        piece = piece.astype(dtype, copy=False)
        arrays += [jax.device_put(piece, d) for d in devices]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _default_shardings(model) -> dict[str, jax.sharding.Sharding]:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return dict.fromkeys(all_variables(model), device)


def model_shardings(model, mesh=None, rules=None) -> dict[str, jax.sharding.Sharding]:
    """Shardings of every variable: from the rules on a mesh, else the first local device."""
    if mesh is None:
        return _default_shardings(model)
    from wfm_jax.core.mesh import param_shardings
    return param_shardings(model, mesh, rules, filter=nnx.Variable)


def _materialise_rest(model, make, shardings) -> None:
    """Give concrete values to variables no rule loaded (buffers, RNG state) by running the
    constructor under jit and keeping only those outputs; XLA drops every other initialiser."""
    rest = {k for k, v in all_variables(model).items()
            if isinstance(v.get_value(), jax.ShapeDtypeStruct)}
    if not rest:
        return

    def build():
        return {k: v.get_value() for k, v in all_variables(make()).items() if k in rest}

    values = jax.jit(build, out_shardings={k: shardings[k] for k in rest})()
    variables = all_variables(model)
    for key, value in values.items():
        variables[key].set_value(value)


def stored_keys(checkpoint_dir: str, tied=()) -> StoredKeys:
    """Header metadata (key -> (shape, dtype)) with tied copies folded into their table keys."""
    return resolve_tied(checkpoint_meta(checkpoint_dir), tuple(tied))


def fill_from_checkpoint(model, table: list[Rule], checkpoint_dir: str,
                         shardings: Mapping[str, jax.sharding.Sharding], tied=()) -> None:
    """Fill an abstract model in place, one tensor at a time, each process reading only the
    slices its shards hold. tied: (copy key, table key) pairs (ModelSpec.tied_copies)."""
    keys = stored_keys(checkpoint_dir, tied)
    check_against_model(table, keys.meta, model)
    variables = all_variables(model)

    def fill(rule, readers):
        var = variables[rule.jax]
        var.set_value(load_tensor(tied_reader(keys, readers, rule.hf), rule, var.shape,
                                  var.dtype, shardings[rule.jax]))

    with open_checkpoint_slices(checkpoint_dir) as readers:
        # tied pairs first: a copy that differs fails before the bulk is read
        failure = None
        for rule in (r for r in table if r.hf in keys.twins):
            try:
                fill(rule, readers)
            except ConversionError as e:
                failure = failure or e
        agree_on_failure(failure)
        for rule in (r for r in table if r.hf not in keys.twins):
            fill(rule, readers)


def agree_on_failure(failure: Exception | None) -> None:
    """Raise on every process when any one found an error in its own slices: each process reads
    (and checks) only its part of a tensor, and one that stopped alone would leave the others
    waiting at their next collective."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        flags = np.asarray(multihost_utils.process_allgather(np.int32(failure is not None)))
        if failure is None and flags.any():
            failing = [int(i) for i in np.flatnonzero(flags)]
            raise ConversionError(f"process(es) {failing} stopped loading the tied checkpoint "
                                  "keys with an error (see their log)")
    if failure is not None:
        raise failure


def fill_from_state(model, state_dir: str, shardings: Mapping[str, jax.sharding.Sharding]) -> None:
    """Fill an abstract model from a wfm_jax state dir (orbax), reading straight into shards."""
    from converters import jax_state
    meta = jax_state.state_meta(state_dir)
    params = flat_params(model)
    missing, extra = set(params) - set(meta), set(meta) - set(all_variables(model))
    if missing or extra:
        raise ConversionError("; ".join(
            p for p in (missing and f"state lacks: {name_list(missing)}",
                        extra and f"state has unknown paths: {name_list(extra)}") if p))
    variables = all_variables(model)
    wrong = [f"{k} {meta[k][0]} (model {tuple(variables[k].shape)})" for k in meta
             if tuple(meta[k][0]) != tuple(variables[k].shape)]
    if wrong:
        raise ConversionError(f"wrong shape for {len(wrong)} path(s): {name_list(wrong)}")
    arrays = jax_state.restore_state(state_dir, shardings={k: shardings[k] for k in meta},
                                     dtypes={k: variables[k].dtype for k in meta})
    for key, value in arrays.items():
        variables[key].set_value(value)


# ----------------------------------------------------------------------------- public API

def load_model(path: str, *, component: str = "transformer", dtype=None,
               param_dtype=jnp.float32, mesh=None, rules=None, **options):
    """(model, config) for a diffusers model dir, a pipeline dir or a wfm_jax state dir.

    options go to the model's constructor (e.g. attention_impl, remat for SD3).
    """
    from converters import jax_state
    directory = resolve_model_dir(path, component)
    config = read_json(os.path.join(directory, "config.json"))
    spec = registry.spec_for(config)
    model = abstract_model(spec, config, dtype, param_dtype, **options)
    shardings = model_shardings(model, mesh, rules)
    if jax_state.is_state_dir(directory):
        fill_from_state(model, directory, shardings)
    else:
        fill_from_checkpoint(model, spec.build_table(config), directory, shardings,
                             tied=spec.tied_copies)
    _materialise_rest(model, lambda: spec.make_model(config, dtype=dtype, param_dtype=param_dtype,
                                                     rngs=nnx.Rngs(0), **options), shardings)
    return model, config


def host_array(value: jax.Array) -> np.ndarray:
    """One parameter on the host (gathered across processes when it spans several)."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(jax.device_get(value))


def write_diffusers_dir(config: Mapping, sources: Mapping[str, tuple[tuple, object]],
                        fetch, dst: str, *, dtype=None, max_shard_bytes: int = 2 << 30,
                        write: bool = True) -> None:
    """Write a diffusers model dir (safetensors + config.json) from wfm_jax tensors, atomically.

    sources: jax path -> (shape, dtype) of every tensor; fetch(paths) -> {path: host array} is
    called one output shard at a time. `dtype` casts on the way out (None keeps each dtype).
    write=False runs the same fetches into a scratch dir (non-primary processes of a gather).
    """
    spec = registry.spec_for(dict(config))
    table = spec.build_table(dict(config))
    want, have = {r.jax for r in table}, set(sources)
    if want != have:
        raise ConversionError("; ".join(
            p for p in (want - have and f"state lacks: {name_list(want - have)}",
                        have - want and f"state has unmapped: {name_list(have - want)}") if p))
    by_hf = {r.hf: r for r in table}
    out_dtype = {r.hf: np.dtype(dtype or sources[r.jax][1]) for r in table}
    nbytes = {r.hf: math.prod(sources[r.jax][0]) * out_dtype[r.hf].itemsize for r in table}

    def load_many(keys):
        arrays = fetch([by_hf[k].jax for k in keys])
        out = {}
        for key in keys:
            rule = by_hf[key]
            out[key] = to_diffusers_tensor(rule, arrays.pop(rule.jax)).astype(out_dtype[key],
                                                                            copy=False)
        return out

    if not write:
        with tempfile.TemporaryDirectory() as scratch:
            save_checkpoint_streaming(nbytes, load_many, scratch, stem=spec.weights_stem,
                                      max_shard_bytes=max_shard_bytes)
        return
    with atomic_directory(dst) as tmp:
        save_checkpoint_streaming(nbytes, load_many, tmp, stem=spec.weights_stem,
                                  max_shard_bytes=max_shard_bytes)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dict(config), f, indent=2, sort_keys=True)
            f.write("\n")


def export_diffusers(model, config: Mapping, dst: str, *, dtype=None,
                     max_shard_bytes: int = 2 << 30) -> None:
    """Write `model`'s base parameters as a diffusers model dir, all or nothing.

    Parameters are fetched to the host one output shard at a time; `dtype` (e.g. jnp.bfloat16)
    casts on the way. In a multi-process run every process must call this; process 0 writes.
    """
    variables = all_variables(model)
    table_paths = {r.jax for r in registry.spec_for(dict(config)).build_table(dict(config))}
    # every base parameter plus whatever non-parameter variables the table exports (buffers)
    paths = set(flat_params(model)) | (table_paths & set(variables))
    sources = {k: (tuple(variables[k].shape), variables[k].dtype) for k in paths}
    write_diffusers_dir(config, sources,
                        lambda keys: {k: host_array(variables[k].get_value()) for k in keys},
                        dst, dtype=dtype, max_shard_bytes=max_shard_bytes,
                        write=jax.process_index() == 0)


def load_transformer(path: str, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
                     **options):
    """The diffusion transformer of a diffusers transformer dir, a pipeline dir (its
    `transformer/`) or a wfm_jax state dir, loaded straight into its shards on `mesh`.

    The returned NNX module is called like the diffusers forward:
    `model(hidden_states, encoder_hidden_states, pooled_projections, timestep)` -> velocity in
    the layout of `hidden_states`. `dtype` is the compute dtype, `param_dtype` the stored one;
    options go to the model constructor (SD3: attention_impl="auto"|"xla"|"cudnn"|None,
    remat=a jax.checkpoint_policies name such as "nothing_saveable", see models.layers.remat).
    `rules` (default: the active ones, wfm_jax.core.mesh.DEFAULT_RULES)
    place the parameters; run the forward under `jax.set_mesh(mesh)` and, for custom rules,
    `wfm_jax.core.mesh.use_rules(rules)` so the activation constraints agree.
    """
    model, _ = load_model(path, component="transformer", dtype=dtype, param_dtype=param_dtype,
                          mesh=mesh, rules=rules, **options)
    return model
