"""Device mesh (data / fsdp / context axes), logical-axis rules, and multi-process start-up.

Models name the axes of parameters and activations logically ("embed", "act_batch", ...); the
rules here map those names to mesh axes, so a model never hard-codes a parallelism layout.
Install a mesh with `jax.set_mesh(mesh)` (never `with mesh:`), and other rules with
`use_rules(rules)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.core.tree import path_str

MESH_AXES = ("data", "fsdp", "context")

Rules = Sequence[tuple[str, Any]]

# logical name -> mesh axis (or tuple of axes, or None = replicated)
DEFAULT_RULES: tuple[tuple[str, object], ...] = (
    ("embed", "fsdp"),
    ("mlp", None),
    ("heads", None),
    ("vocab", None),
    ("conv_in", None),
    ("conv_out", None),
    ("act_batch", ("data", "fsdp")),
    ("act_seq", "context"),
    ("act_heads", None),
    ("act_embed", None),
)

_active_rules: list[Rules] = []


@contextlib.contextmanager
def use_rules(rules: Rules) -> Iterator[None]:
    """Make `rules` the ones `constrain` (and callers passing rules=None) use in this block."""
    _active_rules.append(tuple(rules))
    try:
        yield
    finally:
        _active_rules.pop()


def active_rules() -> Rules:
    return _active_rules[-1] if _active_rules else DEFAULT_RULES


def rules_with(overrides: Mapping[str, object] | Rules, base: Rules | None = None) -> Rules:
    """`base` (default: the active rules) with some logical names mapped differently or added."""
    table = dict(base if base is not None else active_rules())
    table.update(dict(overrides))
    return tuple(table.items())


# ----------------------------------------------------------------------------- mesh construction

@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axis sizes; one of them may be -1 to take all remaining devices."""
    data: int = -1
    fsdp: int = 1
    context: int = 1

    @classmethod
    def from_any(cls, cfg) -> MeshConfig:
        """A MeshConfig, a mapping, or any object with data/fsdp/context attributes (ConfigDict)."""
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d: getattr(cfg, k, d))
        unknown = set(cfg) - set(MESH_AXES) if isinstance(cfg, Mapping) else set()
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; the mesh axes are {MESH_AXES}")
        defaults = cls()
        return cls(**{a: int(get(a, getattr(defaults, a))) for a in MESH_AXES})


def resolve_axis_sizes(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    """Axis sizes in MESH_AXES order with a -1 filled; ValueError naming the numbers if not."""
    sizes = {a: getattr(cfg, a) for a in MESH_AXES}
    bad = {a: s for a, s in sizes.items() if s == 0 or s < -1}
    if bad:
        raise ValueError(f"mesh axis sizes must be positive or -1, got {bad}")
    fill = [a for a, s in sizes.items() if s == -1]
    if len(fill) > 1:
        raise ValueError(f"only one mesh axis may be -1, got {fill}")
    fixed = math.prod(s for s in sizes.values() if s != -1)
    desc = " x ".join(f"{a}={s}" for a, s in sizes.items())
    if fill:
        if num_devices % fixed:
            raise ValueError(f"cannot fill {fill[0]}=-1: the other axes ({desc}) use {fixed} "
                             f"devices, which does not divide the {num_devices} devices available")
        sizes[fill[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(f"mesh {desc} needs {fixed} devices, but {num_devices} are available")
    return tuple(sizes[a] for a in MESH_AXES)


def make_mesh(cfg=None, *, devices: Sequence[jax.Device] | None = None,
              **sizes) -> jax.sharding.Mesh:
    """Mesh with axes (data, fsdp, context) and Auto axis types.

    `make_mesh(MeshConfig(data=2, fsdp=-1))`, `make_mesh({"fsdp": 4})`, `make_mesh(fsdp=4)`.
    """
    if sizes:
        if cfg is not None:
            raise ValueError("give mesh sizes either as a config or as keyword arguments, not both")
        cfg = sizes
    cfg = MeshConfig.from_any(cfg)
    devices = list(devices) if devices is not None else jax.devices()
    shape = resolve_axis_sizes(cfg, len(devices))
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # a TPU torus whose physical axes the sizes are not products of (fsdp 8 x context 8 on
        # v5p 4x4x4): lay the mesh out splitting physical axes, as JAX's own message suggests,
        # rather than end the run on a layout the devices can hold
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


# ----------------------------------------------------------------------------- logical -> mesh

def mesh_axes_of(entry) -> tuple[str, ...]:
    """The mesh axes a rule entry names (None, one axis, or a tuple of them), as a tuple."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def logical_to_spec(axes: Sequence[str | None], rules: Rules | None = None) -> P:
    """PartitionSpec for logical axis names (None = replicated); a name without a rule is an
    error, so a typo cannot silently replicate an activation."""
    table = dict(rules if rules is not None else active_rules())
    unknown = [a for a in axes if a is not None and a not in table]
    if unknown:
        raise ValueError(f"logical axes {unknown} have no rule; rules cover {sorted(table)}")
    return P(*[table[a] if a is not None else None for a in axes])


def mesh_size_for(mesh, logical_name: str, rules: Rules | None = None) -> int:
    """How many shards the rules split a dimension named `logical_name` into on this mesh."""
    entry = dict(rules if rules is not None else active_rules()).get(logical_name)
    return math.prod(mesh.shape[a] for a in mesh_axes_of(entry))


def _check_divides(mesh, size: int, logical_name: str, what: str, rules) -> None:
    entry = dict(rules if rules is not None else active_rules()).get(logical_name)
    axes = mesh_axes_of(entry)
    n = math.prod(mesh.shape[a] for a in axes)
    if size % n:
        layout = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
        raise ValueError(f"{what} {size} is not divisible by {n} ({logical_name} is split over "
                         f"mesh axes {layout})")


def check_batch(mesh, batch: int, rules: Rules | None = None) -> None:
    _check_divides(mesh, batch, "act_batch", "global batch size", rules)


def check_heads(mesh, heads: int, rules: Rules | None = None) -> None:
    _check_divides(mesh, heads, "act_heads", "number of attention heads", rules)


def check_sequence(mesh, seq_len: int, rules: Rules | None = None) -> None:
    _check_divides(mesh, seq_len, "act_seq", "sequence length", rules)


def _validate_spec(name: str, shape, logical, spec: P, mesh) -> None:
    used: list[str] = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = mesh_axes_of(entry)
        unknown = [a for a in axes if a not in mesh.shape]
        if unknown:
            raise ValueError(f"{name}: logical axes {logical} map to {unknown}, which are not mesh "
                             f"axes {tuple(mesh.shape)}; add a rule for them")
        used += axes
        n = math.prod(mesh.shape[a] for a in axes)
        if dim % n:
            raise ValueError(f"{name}: dimension {dim} of shape {tuple(shape)} (logical axes "
                             f"{logical}) is not divisible by mesh axes {axes} = {n}")
    if len(set(used)) != len(used):
        raise ValueError(f"{name}: logical axes {logical} use a mesh axis twice ({spec})")


def param_shardings(model: nnx.Module, mesh, rules: Rules | None = None,
                    filter=nnx.Param) -> dict[str, NamedSharding]:
    """Dotted path -> NamedSharding for every variable matching `filter` (abstract or concrete).

    Variables carry logical names in their `out_sharding` metadata; variables without any are
    replicated. Unknown mesh axes, reused mesh axes and non-dividing dimensions raise ValueError
    naming the parameter.
    """
    rules = tuple(rules if rules is not None else active_rules())
    state = nnx.state(model, filter)
    with nnx.logical_axis_rules(rules):
        specs = nnx.get_partition_spec(state)
    out = {}
    for (path, spec_var), (_, var) in zip(specs.flat_state(), state.flat_state()):
        name = path_str(path)
        spec = spec_var.get_value() if isinstance(spec_var, nnx.Variable) else spec_var
        spec = spec if isinstance(spec, P) else P()
        _validate_spec(name, var.shape, getattr(var, "out_sharding", None), spec, mesh)
        out[name] = NamedSharding(mesh, spec)
    return out


class MeshJit:
    """`jax.jit(fn, **jit_kwargs)` whose every trace (first call, `lower`) runs under
    `jax.set_mesh(mesh)` and `use_rules(rules)`: the models' activation constraints (batch over
    data x fsdp, sequence over context) only act under a mesh, so a step traced outside it
    silently computes every sample whole on every context device."""

    def __init__(self, fn, mesh, rules: Rules | None = None, **jit_kwargs):
        self.mesh = mesh
        self.rules = tuple(rules if rules is not None else active_rules())
        self.jitted = jax.jit(fn, **jit_kwargs)

    def __call__(self, *args, **kwargs):
        with jax.set_mesh(self.mesh), use_rules(self.rules):
            return self.jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        with jax.set_mesh(self.mesh), use_rules(self.rules):
            return self.jitted.lower(*args, **kwargs)

    def compiles(self) -> int:
        """Entries in jit's dispatch cache: at least one per program compiled, but an entry can
        be added without a compile (count XLA compiles with jax.monitoring's
        /jax/core/compile/backend_compile_duration events, as tests/train/test_no_recompile.py)."""
        return self.jitted._cache_size()  # type: ignore[attr-defined]  # jax's own counter


def mesh_of(tree) -> jax.sharding.Mesh:
    """The mesh the arrays of `tree` live on (their NamedSharding's), else a one-device mesh on
    the first array's device: a model loaded without a mesh still runs under one."""
    leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    for x in leaves:
        if isinstance(x.sharding, NamedSharding) and isinstance(x.sharding.mesh, jax.sharding.Mesh):
            return x.sharding.mesh
    device = next(iter(leaves[0].devices())) if leaves else jax.devices()[0]
    return make_mesh(devices=[device])


def mesh_jit(fn=None, *, mesh, rules: Rules | None = None, **jit_kwargs):
    """MeshJit as a function or a decorator (`@mesh_jit(mesh=m, donate_argnums=0)`)."""
    if fn is None:
        return lambda f: MeshJit(f, mesh, rules, **jit_kwargs)
    return MeshJit(fn, mesh, rules, **jit_kwargs)


def constrain(x: jax.Array, axes: Sequence[str | None], rules: Rules | None = None) -> jax.Array:
    """Sharding constraint on an activation by logical names; a no-op outside a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, rules))


# ----------------------------------------------------------------------------- multi-process

def maybe_initialize_distributed(coordinator_address: str | None = None,
                                 num_processes: int | None = None,
                                 process_id: int | None = None) -> bool:
    """Start jax.distributed when more than one process takes part; True if it did.

    Unset arguments come from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
    A single process (the default) does nothing.
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    if num_processes is None and env.get("JAX_NUM_PROCESSES"):
        num_processes = int(env["JAX_NUM_PROCESSES"])
    if process_id is None and env.get("JAX_PROCESS_ID"):
        process_id = int(env["JAX_PROCESS_ID"])
    if num_processes is None or num_processes <= 1:
        return False
    if coordinator_address is None or process_id is None:
        raise ValueError(f"{num_processes} processes need a coordinator address and a process "
                         f"id (got coordinator_address={coordinator_address!r}, "
                         f"process_id={process_id})")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is outside [0, {num_processes})")
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True


def shutdown_distributed() -> None:
    """Leave jax.distributed through its shutdown barrier, while every backend is still up.

    Without it the processes leave through JAX's exit hook, which tears the CPU/GPU client down
    before the barrier: one process can drop its collectives' connections or the coordination
    service while a peer is still leaving, and that peer can die with SIGABRT after a finished
    run (the likely cause of one CI failure, exit -6 on two CPU processes). A single process:
    nothing to do.
    """
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
