"""How a trainable transformer is built beyond its architecture config, as one typed value.

The recipe's `policy.attention_impl`, `policy.remat`, `policy.scan_layers`,
`policy.context_parallel_impl` and `policy.norm_checkpoints` travel from the trainer, planner
and benchmark through the family loaders to the model constructor as a `ModelOptions`, never as
a loose dict. `remat` holds a `jax.checkpoint_policies` name (the short aliases of
models/layers/remat.py are turned into it).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from wfm_jax.models.layers.attention import ATTENTION_IMPLS
from wfm_jax.models.layers.remat import NO_REMAT, check_remat

CONTEXT_PARALLEL_IMPLS = ("auto", "ulysses", "ring")


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """attention_impl: auto | xla | cudnn | blockwise | pallas (auto: by the mesh's platform);
    remat: per block, a jax.checkpoint_policies name; scan_layers: runs of identical blocks as
    one lax.scan; context_parallel_impl: how a context-split sequence attends (auto | ulysses |
    ring); norm_checkpoints: each norm and modulation helper as its own jax.checkpoint
    (models/layers/norms.py), on by default."""

    attention_impl: str | None = "auto"
    remat: str = NO_REMAT
    scan_layers: bool = False
    context_parallel_impl: str = "auto"
    norm_checkpoints: bool = True

    def __post_init__(self) -> None:
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, "
                             f"got {self.attention_impl!r}")
        if self.context_parallel_impl not in CONTEXT_PARALLEL_IMPLS:
            raise ValueError(f"context_parallel_impl must be one of {CONTEXT_PARALLEL_IMPLS}, "
                             f"got {self.context_parallel_impl!r}")
        object.__setattr__(self, "remat", check_remat(self.remat))
        object.__setattr__(self, "scan_layers", bool(self.scan_layers))
        object.__setattr__(self, "norm_checkpoints", bool(self.norm_checkpoints))

    @classmethod
    def from_policy(cls, policy: Any, **overrides: Any) -> ModelOptions:
        """From a recipe's `policy` section (any object with these attributes); `overrides`
        replace single fields (the planner's remat / scan sweeps)."""
        values = {f.name: getattr(policy, f.name) for f in dataclasses.fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def constructor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every transformer constructor."""
        return dataclasses.asdict(self)
