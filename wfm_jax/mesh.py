"""Device mesh (data / fsdp / context axes) and logical-axis rules.

Models name the axes of parameters and activations logically ("embed", "act_batch", ...); the
rules here map those names to mesh axes, so a model never hard-codes a parallelism layout.
"""
from __future__ import annotations

from typing import Sequence

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "context")

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


def logical_to_spec(axes: Sequence[str | None], rules=DEFAULT_RULES) -> P:
    table = dict(rules)
    return P(*[table.get(a) if a is not None else None for a in axes])


def constrain(x: jax.Array, axes: Sequence[str | None], rules=DEFAULT_RULES) -> jax.Array:
    """Sharding constraint on an activation by logical names; a no-op outside a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, rules))
