"""Configurable rematerialisation of a model's repeated blocks (`policy.remat`)."""
from __future__ import annotations

import jax
from flax import nnx

# "none": keep every activation; "full": recompute the whole block in the backward pass;
# "dots": keep only matmul outputs without batch dims (the linear layers), recompute the rest.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def check_remat(remat: str) -> None:
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)}, got {remat!r}")


def call_block(block: nnx.Module, remat: str, *args):
    """block(*args), under jax.checkpoint with the named policy unless remat is "none".

    jax.checkpoint of a pure function of the block's state, not nnx.remat: nnx.remat writes the
    state back after the call, which fails when the model was merged inside another trace (the
    RL rollout's lax.scan: "Cannot mutate Param from a different trace level").
    """
    if remat == "none":
        return block(*args)
    graphdef, state = nnx.split(block)

    def pure(state, *a):
        return nnx.merge(graphdef, state)(*a)

    return jax.checkpoint(pure, policy=REMAT_POLICIES[remat])(state, *args)
