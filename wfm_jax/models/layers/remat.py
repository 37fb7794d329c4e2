"""Rematerialisation and layer scan of a model's repeated blocks (`policy.remat`,
`policy.scan_layers`), shared by every family's transformer.

Policies (per block) carry the names of `jax.checkpoint_policies`, saying what the backward keeps:
  everything_saveable              keep every activation (no rematerialisation at all);
  nothing_saveable                 keep only the block's inputs, recompute the whole block;
  dots_with_no_batch_dims_saveable keep matmul outputs without batch dims (the linear layers),
                                   recompute the rest;
  dots_saveable                    keep every matmul output (attention's batched QK^T / PV
                                   included: S x S on the XLA attention path), recompute the
                                   elementwise work only;
  offload_dot_with_no_batch_dims   as dots_with_no_batch_dims_saveable, but the kept matmul
                                   outputs go to pinned host memory (GPU, TPU). The CPU backend
                                   has no separate host memory space: there it runs as
                                   dots_with_no_batch_dims_saveable (one warning line).
Two more keep the flash attention kernel's residuals (its q, k, v, output and softmax
statistics, tagged ATTENTION_RESIDUALS by `keep_residuals`) so that the backward never reruns the
attention forward, which under the policies above it does (a cuDNN or Pallas call is not a dot):
  attention_saveable               keep those only, recompute the rest of the block;
  dots_with_no_batch_dims_and_attention_saveable
                                   those and the linear layers' outputs.
They matter where attention dominates (video DiTs at 25-33k tokens: 71% of Wan's forward FLOPs);
on the XLA attention path nothing is tagged (its residual is the S x S softmax), so there they run
as nothing_saveable / dots_with_no_batch_dims_saveable.
The project's earlier short names stay accepted (REMAT_ALIASES: none, full, dots, dots_no_batch,
offload); `check_remat` turns either into the JAX name, which is what a model stores.

The parameter layout never changes: one module per block (`blocks.3.attn1.to_q.kernel`), so
checkpoints and converter tables are the same with scan on or off. A scanned run stacks its
blocks' weights inside the traced step (a copy in each layer's compute dtype, sharded like them).
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wfm_jax.models.layers.linear import Linear

NO_REMAT = "everything_saveable"
OFFLOAD = "offload_dot_with_no_batch_dims"
ATTENTION_RESIDUALS = "attention_residuals"  # the checkpoint_name keep_residuals tags
_KEEP_ATTENTION = jax.checkpoint_policies.save_only_these_names(ATTENTION_RESIDUALS)
REMAT_POLICIES = {
    NO_REMAT: None,  # no jax.checkpoint at all: the same result, without the wrapper
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    OFFLOAD: jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
    "attention_saveable": _KEEP_ATTENTION,
    "dots_with_no_batch_dims_and_attention_saveable": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _KEEP_ATTENTION),
}
# the short names recipes used before the policies took JAX's names ("dots" read backwards)
REMAT_ALIASES = {"none": NO_REMAT, "full": "nothing_saveable",
                 "dots": "dots_with_no_batch_dims_saveable", "dots_no_batch": "dots_saveable",
                 "offload": OFFLOAD}
REMAT_NAMES = (*REMAT_POLICIES, *REMAT_ALIASES)
ATTENTION_POLICIES = ("attention_saveable", "dots_with_no_batch_dims_and_attention_saveable")
# set while a block under one of ATTENTION_POLICIES is traced: keep_residuals acts only then
_TAGGING = contextvars.ContextVar("wfm_jax_tag_attention_residuals", default=False)


def check_remat(remat: str) -> str:
    """The jax.checkpoint_policies name of `remat` (a JAX name or one of REMAT_ALIASES)."""
    if remat in REMAT_POLICIES:
        return remat
    if remat in REMAT_ALIASES:
        return REMAT_ALIASES[remat]
    raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)} (or the short names "
                     f"{sorted(REMAT_ALIASES)}), got {remat!r}")


def rematerialises(remat: str | None) -> bool:
    """Whether the policy recomputes anything in the backward."""
    return remat is not None and check_remat(remat) != NO_REMAT


def resolve_remat(remat: str) -> str:
    """The policy that runs on this backend: offloading needs a host memory space (not CPU)."""
    remat = check_remat(remat)
    if remat == OFFLOAD and jax.default_backend() == "cpu":
        warnings.warn(f"policy.remat={OFFLOAD}: the CPU backend has no pinned host memory; "
                      "running remat=dots_with_no_batch_dims_saveable instead", stacklevel=3)
        return "dots_with_no_batch_dims_saveable"
    return remat


def keep_residuals(fn, name: str = ATTENTION_RESIDUALS):
    """fn(*arrays) -> array with the same value and gradient, whose backward residuals carry
    checkpoint_name(`name`), so a remat policy that saves the name keeps them.

    Names on fn's output alone do not do it: a custom_vjp kernel (cuDNN, Pallas flash) makes
    its residuals inside its own forward rule, out of a policy's reach, so the backward reruns
    that forward. Here the forward is jax.vjp(fn) and its residuals, the leaves of the pullback,
    are tagged where the policy sees them; the backward applies that pullback. The output is
    tagged too: what the block does with it afterwards needs it, and an untagged output would
    be recomputed by rerunning the kernel. Outside a block traced under ATTENTION_POLICIES
    (`checkpointed`) it is fn itself: no other run's program changes."""
    @jax.custom_vjp
    def call(*args):
        return fn(*args)

    def fwd(*args):
        out, pullback = jax.vjp(fn, *args)
        return out, jax.tree.map(lambda r: checkpoint_name(r, name)
                                 if isinstance(r, jax.Array) else r, pullback)

    def bwd(pullback, g):
        return pullback(g)

    call.defvjp(fwd, bwd)

    def maybe(*args):
        return checkpoint_name(call(*args), name) if _TAGGING.get() else fn(*args)
    return maybe


@contextlib.contextmanager
def _tagging():
    token = _TAGGING.set(True)
    try:
        yield
    finally:
        _TAGGING.reset(token)


def checkpointed(fn, remat: str, *, prevent_cse: bool = True):
    """fn under jax.checkpoint with the named policy (fn itself for everything_saveable)."""
    remat = resolve_remat(remat)
    if remat == NO_REMAT:
        return fn
    checkpoint = jax.checkpoint(fn, policy=REMAT_POLICIES[remat], prevent_cse=prevent_cse)
    if remat not in ATTENTION_POLICIES:
        return checkpoint

    def tagged(*args):  # fn is traced inside this call: keep_residuals sees the flag
        with _tagging():
            return checkpoint(*args)
    return tagged


def call_block(block: nnx.Module, remat: str, *args):
    """block(*args), under jax.checkpoint with the named policy unless it keeps everything.

    jax.checkpoint of a pure function of the block's state, not nnx.remat: nnx.remat writes the
    state back after the call, which fails when the model was merged inside another trace (the
    RL rollout's lax.scan: "Cannot mutate Param from a different trace level").
    """
    if not rematerialises(remat):
        return block(*args)
    graphdef, state = nnx.split(block)

    def pure(state, *a):
        return nnx.merge(graphdef, state)(*a)

    return checkpointed(pure, remat)(state, *args)


def compute_state(block: nnx.Module) -> nnx.State:
    """The block's state with each Linear's weights already cast to its compute dtype (the cast
    it does at use anyway; fp32 parts such as AdaLN modulation stay fp32): the scanned stack then
    holds half the bytes, and FSDP gathers bf16, not fp32."""
    casts = {path: m.dtype for path, m in nnx.iter_graph(block)
             if isinstance(m, Linear) and m.dtype is not None}
    flat = []
    for path, var in nnx.state(block).flat_state():
        dtype = casts.get(tuple(path[:-1]))
        if dtype is not None and path[-1] in _LINEAR_WEIGHTS:
            var = var.replace(var.get_value().astype(dtype))
        flat.append((path, var))
    return nnx.State.from_flat_path(flat)


_LINEAR_WEIGHTS = ("kernel", "bias", "lora_a", "lora_b")


def block_groups(blocks, scan_layers: bool) -> list[list[int]]:
    """Runs of consecutive blocks with one structure (one graphdef): each run of two or more is
    one lax.scan when scan_layers, else every block is its own group."""
    groups: list[list[int]] = []
    last = None
    for i, block in enumerate(blocks):
        graphdef = nnx.graphdef(block)
        if groups and scan_layers and graphdef == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        last = graphdef
    return groups


def run_blocks(blocks, carry, apply, *, remat: str, scan_layers: bool):
    """carry through every block in order: carry = apply(block, carry), each block under the
    remat policy; runs of identical blocks as one lax.scan over their stacked weights.

    apply(block, carry) -> carry closes over what every block reads alike (text, rope, temb).
    Scanned, XLA keeps one block's activations (and under FSDP one block's gathered weights)
    live at a time and the policy applies per iteration; unrolled, it may schedule every
    recomputation before the backward, and remat saves less.
    """
    for group in block_groups(blocks, scan_layers):
        graphdef = nnx.graphdef(blocks[group[0]])

        def pure(state, carry, graphdef=graphdef):
            return apply(nnx.merge(graphdef, state), carry)

        if len(group) == 1:
            if not rematerialises(remat):
                carry = apply(blocks[group[0]], carry)
            else:
                carry = checkpointed(pure, remat)(nnx.state(blocks[group[0]]), carry)
            continue
        # inside a scan XLA cannot CSE the recompute away: the barrier against it is not needed
        fn = checkpointed(pure, remat, prevent_cse=False)
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                               *[compute_state(blocks[i]) for i in group])
        def body(c, s, fn=fn):
            return fn(s, c), None

        carry, _ = jax.lax.scan(body, carry, stacked)
    return carry
