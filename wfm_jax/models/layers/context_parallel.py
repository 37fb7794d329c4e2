"""Context parallelism for softmax attention on the XLA path: the token sequence split over the
mesh axes that `act_seq` maps to (normally `context`), attention computed without gathering it.

Two schemes, `policy.context_parallel_impl`:
  "ulysses": one all-to-all turns the sequence split into a heads split (each device then sees
      the whole sequence for N/n heads), the kernel runs locally, one all-to-all turns it back.
      Needs the heads (per batch/heads shard) to divide by the n sequence shards.
  "ring":    K/V chunks rotate round the devices (ring_attention); any head count.
  "auto":    Ulysses when the heads divide, ring otherwise.

Layout. Everything runs in one shard_map whose inputs are "parts", each (q, k, v) split along
its own sequence: self-attention is one part; SD3's joint attention is two, the image tokens
and the text tokens, each padded to a multiple of n and split on its own, so no part is
re-laid-out and every device holds one chunk of each. Inside, a device concatenates its local
chunks: softmax attention does not care in which order the keys come, and each query's output
returns to its own part. Padded keys are masked by a per-part key mask that is split (and, in
the ring, rotated) with the keys; padded queries are computed and sliced off.
Cross-attention whose K/V (the text) are replicated over the sequence axes needs neither
scheme: `local_queries_attention` attends each device's queries to all keys in place.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from wfm_jax.core import mesh
from wfm_jax.models.layers.blockwise_attention import blockwise_attention
from wfm_jax.models.layers.ring_attention import ring_attention

CONTEXT_PARALLEL_IMPLS = ("auto", "ulysses", "ring")
QKV_AXES = ("act_batch", "act_seq", "act_heads", None)
KV_REPLICATED_AXES = ("act_batch", None, "act_heads", None)


def check_context_parallel_impl(impl) -> None:
    if impl not in CONTEXT_PARALLEL_IMPLS:
        raise ValueError(f"context_parallel_impl must be one of {CONTEXT_PARALLEL_IMPLS}, "
                         f"got {impl!r}")


def has_mesh() -> bool:
    m = jax.sharding.get_abstract_mesh()
    return m is not None and not m.empty


def sequence_axes() -> tuple[str, ...]:
    """The mesh axes (of size > 1) splitting the sequence (act_seq) under the active mesh and
    rules; () without a mesh or without a split."""
    if not has_mesh():
        return ()
    m = jax.sharding.get_abstract_mesh()
    rules = dict(mesh.active_rules())
    return tuple(a for a in mesh.mesh_axes_of(rules.get("act_seq")) if m.shape[a] > 1)


def _size(axes) -> int:
    m = jax.sharding.get_abstract_mesh()
    return math.prod(m.shape[a] for a in axes)


def resolve_context_parallel(impl, heads: int, axes) -> str:
    """"ulysses" or "ring" for `heads` attention heads with the sequence split over `axes`;
    "auto" takes Ulysses when the heads (per act_heads shard) divide by the split."""
    check_context_parallel_impl(impl)
    n = _size(axes)
    local_heads, rem = divmod(heads, mesh.mesh_size_for(jax.sharding.get_abstract_mesh(),
                                                         "act_heads"))
    divides = not rem and local_heads % n == 0
    if impl == "auto":
        return "ulysses" if divides else "ring"
    if impl == "ulysses" and not divides:
        raise ValueError(f"context_parallel_impl='ulysses' with the sequence split {n} ways: "
                         f"the {heads} attention heads must divide by {n}; use 'ring' or 'auto'")
    return impl


def local_kernel(impl):
    """The single-device kernel (q, k, v, kv_mask or None) -> out for an attention_impl."""
    if impl == "blockwise":
        return blockwise_attention
    if impl == "pallas":
        from wfm_jax.models.layers.pallas_attention import pallas_tpu_attention
        return pallas_tpu_attention

    def xla(q, k, v, kv_mask=None):
        mask = None if kv_mask is None else kv_mask[None, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    return xla


def shard_map(fn, *, impl, in_specs, out_specs):
    """jax.shard_map over the active mesh; with `check_vma=False` where the kernel is Pallas.

    JAX's Pallas TPU kernels (flash_attention) declare their outputs as plain ShapeDtypeStructs,
    which carry no varying-over-mesh-axes type, and shard_map's default check refuses them at
    trace time ("manual_axis_type on jax.ShapeDtypeStruct must not be None"). Without the check
    shard_map's transpose sums the cotangent of an input over the mesh axes its spec leaves out
    (replicated K/V: the psum pcast's transpose gives under the check) and `pcast` is a no-op,
    so the same code differentiates correctly either way (tested against XLA attention)."""
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs,
                         check_vma=impl != "pallas")


def ulysses_attention(q, k, v, kv_mask, axes, kernel):
    """Inside shard_map: local (B, t, N, H) chunks -> all-to-all to (B, n t, N / n, H), the
    kernel over the whole sequence for this device's heads, and back."""
    def to_heads(x):
        return jax.lax.all_to_all(x, axes, 2, 1, tiled=True)

    mask = None if kv_mask is None else jax.lax.all_gather(kv_mask, axes, tiled=True)
    out = kernel(to_heads(q), to_heads(k), to_heads(v), mask)
    return jax.lax.all_to_all(out, axes, 1, 2, tiled=True)


def _pad(x, n, axis=1):
    pad = -x.shape[axis] % n
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _batch_multiple() -> int:
    """shard_map needs the batch to divide its shards (GSPMD did not): smaller or uneven
    batches are padded with zero rows (their attention is finite) and sliced off."""
    return mesh.mesh_size_for(jax.sharding.get_abstract_mesh(), "act_batch")


def context_parallel_attention(parts, *, impl: str, scheme: str, axes):
    """Attention over the union of `parts`' tokens with the sequence split over `axes`.

    parts: list of (q, k, v), (B, T_i, N, H) / (B, S_i, N, H), each laid out with its sequence
    along act_seq. Returns one (B, T_i, N, H) output per part (queries of every part attend to
    the keys of every part). impl: the local kernel for Ulysses ("xla", "blockwise", "pallas");
    the ring always attends chunk by chunk with the blockwise kernel.
    """
    n, nb = _size(axes), _batch_multiple()
    spec = mesh.logical_to_spec(QKV_AXES)
    padded, masks = [], []
    for q, k, v in parts:
        padded += [_pad(_pad(x, n), nb, axis=0) for x in (q, k, v)]
        masks.append(jnp.arange(padded[-2].shape[1]) < k.shape[1])
    masked = any(k.shape[1] % n for _, k, _ in parts)
    q_lens = [padded[3 * i].shape[1] // n for i in range(len(parts))]

    def local(*args):
        chunks, local_masks = args[:3 * len(parts)], args[3 * len(parts):]
        q, k, v = (jnp.concatenate(chunks[i::3], axis=1) for i in range(3))
        mask = jnp.concatenate(local_masks)
        if scheme == "ring":
            out = ring_attention(q, k, v, mask, axes)
        else:
            out = ulysses_attention(q, k, v, mask if masked else None, axes, local_kernel(impl))
        bounds = [sum(q_lens[:i]) for i in range(1, len(parts))]
        return tuple(jnp.split(out, bounds, axis=1))

    fn = shard_map(local, impl=impl if scheme == "ulysses" else "blockwise",
                   in_specs=(spec,) * len(padded) + (P(spec[1]),) * len(masks),
                   out_specs=(spec,) * len(parts))
    outs = fn(*padded, *masks)
    return [o[:q.shape[0], :q.shape[1]] for o, (q, _, _) in zip(outs, parts, strict=True)]


def local_queries_attention(q, k, v, *, impl: str):
    """Cross-attention with the queries split along the sequence and K/V (the text) replicated
    over it: each device attends its own queries to all keys (shard_map; no collective beyond
    bringing K/V to every device). Queries that do not divide the split are padded."""
    n = _size(sequence_axes())
    spec, kv_spec = mesh.logical_to_spec(QKV_AXES), mesh.logical_to_spec(KV_REPLICATED_AXES)
    kernel = local_kernel(impl)
    seq = mesh.mesh_axes_of(spec[1])

    def local(q, k, v):
        # K/V are the same on every sequence shard; marked varying there so that their
        # gradient is the sum of every shard's (pcast's transpose is a psum)
        k, v = (jax.lax.pcast(t, seq, to="varying") for t in (k, v))
        return kernel(q, k, v, None)

    fn = shard_map(local, impl=impl, in_specs=(spec, kv_spec, kv_spec), out_specs=spec)
    nb = _batch_multiple()
    out = fn(_pad(_pad(q, n), nb, axis=0), _pad(k, nb, axis=0), _pad(v, nb, axis=0))
    return out[:q.shape[0], :q.shape[1]]


def sharded_heads_first_attention(q, k, v):
    """The Pallas kernel on (B, N, T, H) q, k, v under a mesh whose sequence is not split:
    shard_map over the batch and heads, as sharded_local_attention does for (B, T, N, H)."""
    from wfm_jax.models.layers.pallas_attention import heads_first_attention
    batch, _, heads, _ = mesh.logical_to_spec(KV_REPLICATED_AXES)
    spec = P(batch, heads, None, None)
    fn = shard_map(heads_first_attention, impl="pallas", in_specs=(spec,) * 3, out_specs=spec)
    nb = _batch_multiple()
    return fn(*(_pad(x, nb, axis=0) for x in (q, k, v)))[:q.shape[0]]


def sharded_local_attention(q, k, v, *, impl: str):
    """A non-XLA-native kernel (blockwise, Pallas) under a mesh whose sequence is not split:
    shard_map over the batch and heads, so GSPMD never has to partition its loops."""
    spec = mesh.logical_to_spec(KV_REPLICATED_AXES)
    kernel = local_kernel(impl)
    nb = _batch_multiple()
    fn = shard_map(lambda q, k, v: kernel(q, k, v, None), impl=impl, in_specs=(spec,) * 3,
                   out_specs=spec)
    return fn(*(_pad(x, nb, axis=0) for x in (q, k, v)))[:q.shape[0]]
