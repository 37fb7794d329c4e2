"""SANA's ReLU linear self-attention (diffusers `SanaLinearAttnProcessor2_0` for SANA1.5 and
`SanaLinearAttnProcessor3_0` for SANA-Video).

With q, k = ReLU(norm(q)), ReLU(norm(k)) per head, every query reads one d x d state:

    out_n = (sum_m v_m k_m^T) q_n / ((sum_m k_m)^T q_n + 1e-15)

diffusers gets the normaliser by padding v with a row of ones (its last output row); here the
key sum is kept apart, which is the same sum. SANA-Video rotates q and k (Wan RoPE) for the
numerator only: its normaliser uses the un-rotated q and k. The state, the normaliser and the
division are fp32 whatever the compute dtype, as diffusers casts them. The module's self-attention
`attention_mask` does not exist: diffusers ignores it.

Sums over the sequence are the only cross-token operations, so a sequence split over `context`
needs just an all-reduce of the (d x d) state and the key sum, no ring:
`context_parallel_linear_attention` does that with shard_map, and the module uses it whenever a
mesh splits the tokens (the rest of the block stays with GSPMD).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from wfm_jax.core import mesh
from wfm_jax.models.layers.attention import QKV_AXES
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import RMSNorm
from wfm_jax.models.wan.rope import apply_rope

EPS = 1e-15  # diffusers adds it to the normaliser
QK_NORM_EPS = 1e-5  # diffusers Attention's default eps, used by its q/k RMSNorm


def kv_state(k, v):
    """sum over tokens of v k^T per head: (B, N, H, d) each -> (B, H, d_v, d_k)."""
    return jnp.einsum("bnhe,bnhd->bhed", v, k)


def key_sum(k):
    """(B, N, H, d) -> (B, H, d)."""
    return jnp.sum(k, axis=1)


def read_state(state, ksum, q, q_num=None, *, rotated: bool):
    """Apply the state to the queries. q (B, N, H, d) gives the normaliser, q_num (default q) the
    numerator. `rotated` picks diffusers' 3_0 arithmetic (times the reciprocal) over 2_0's
    division, so both round as diffusers does."""
    q_num = q if q_num is None else q_num
    num = jnp.einsum("bhed,bnhd->bnhe", state, q_num)
    den = jnp.einsum("bhd,bnhd->bnh", ksum, q)[..., None]
    return num * (1.0 / (den + EPS)) if rotated else num / (den + EPS)


def linear_attention(q, k, v, rope=None):
    """q, k (already ReLU'd), v: (B, N, H, d) -> (B, N, H, d) fp32. rope: (cos, sin) tables of
    wan.rope.rope_tables for the N tokens (SANA-Video) or None (SANA1.5)."""
    q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
    if rope is None:
        return read_state(kv_state(k, v), key_sum(k), q, rotated=False)
    q_rot, k_rot = apply_rope(q, *rope), apply_rope(k, *rope)
    return read_state(kv_state(k_rot, v), key_sum(k), q, q_rot, rotated=True)


def _local(q, k, v, *rope, seq_axes):
    """One shard of the tokens: partial state and key sum, summed over the sequence shards."""
    q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
    k_num = apply_rope(k, *rope) if rope else k
    state = jax.lax.psum(kv_state(k_num, v), seq_axes)
    ksum = jax.lax.psum(key_sum(k), seq_axes)
    return read_state(state, ksum, q, apply_rope(q, *rope) if rope else None, rotated=bool(rope))


def sequence_split(n_tokens: int, batch: int, heads: int):
    """The mesh axes that split the tokens (act_seq) under the active mesh and rules, when the
    batch, tokens and heads divide their shards; None (no split, no mesh, or uneven: GSPMD then
    partitions the plain einsums, with the same sums)."""
    m = jax.sharding.get_abstract_mesh()
    if m is None or m.empty:
        return None
    rules = dict(mesh.active_rules())
    seq = tuple(a for a in mesh.mesh_axes_of(rules.get("act_seq")) if m.shape[a] > 1)
    if not seq:
        return None
    sizes = [math.prod(m.shape[a] for a in mesh.mesh_axes_of(rules.get(name)))
             for name in ("act_batch", "act_seq", "act_heads")]
    if batch % sizes[0] or n_tokens % sizes[1] or heads % sizes[2]:
        return None
    return seq


def context_parallel_linear_attention(q, k, v, rope=None, *, seq_axes):
    """`linear_attention` with the tokens split over the mesh axes `seq_axes` (shard_map under
    the active mesh; q, k, v laid out by QKV_AXES, the RoPE rows split like the tokens): each
    shard sums its part of the state and the key sum, one psum of those two small tensors, then
    each shard reads its own queries."""
    spec = mesh.logical_to_spec(QKV_AXES)
    tables = tuple(rope or ())
    fn = jax.shard_map(lambda *a: _local(*a, seq_axes=seq_axes),
                       in_specs=(spec, spec, spec) + (P(spec[1], None),) * len(tables),
                       out_specs=spec)
    return fn(q, k, v, *tables)


class SanaLinearAttention(nnx.Module):
    """diffusers `Attention` with a Sana linear processor; module names as diffusers' (to_q,
    to_k, to_v, to_out.0, norm_q, norm_k) so checkpoints and LoRA targets map one-to-one.
    qk_norm: None or "rms_norm_across_heads" (one RMSNorm over all heads, eps 1e-5)."""

    def __init__(self, dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs, bias: bool,
                 qk_norm: str | None, dtype=None, param_dtype=jnp.float32):
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        lin = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.to_q = Linear(dim, inner, bias=bias, axes=("embed", "heads"), **lin)
        self.to_k = Linear(dim, inner, bias=bias, axes=("embed", "heads"), **lin)
        self.to_v = Linear(dim, inner, bias=bias, axes=("embed", "heads"), **lin)
        self.to_out = nnx.List([Linear(inner, dim, axes=("heads", "embed"), **lin)])
        norm = dict(eps=QK_NORM_EPS, param_dtype=param_dtype, axes=("heads",))
        self.norm_q = RMSNorm(inner, **norm) if qk_norm else None
        self.norm_k = RMSNorm(inner, **norm) if qk_norm else None

    def _heads(self, x):
        return x.reshape(*x.shape[:2], self.heads, self.head_dim)

    def __call__(self, x, rope=None):
        """x (B, N, D) -> (B, N, D) in x's dtype; rope as for `linear_attention`."""
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        if self.norm_q is not None:
            q, k = self.norm_q(q), self.norm_k(k)
        q, k = jax.nn.relu(self._heads(q)), jax.nn.relu(self._heads(k))
        v = self._heads(v)
        seq_axes = sequence_split(x.shape[1], x.shape[0], self.heads)
        if seq_axes is None:
            out = linear_attention(q, k, v, rope)
        else:
            q, k, v = (mesh.constrain(t, QKV_AXES) for t in (q, k, v))
            out = context_parallel_linear_attention(q, k, v, rope, seq_axes=seq_axes)
        return self.to_out[0](out.reshape(*x.shape[:2], -1).astype(x.dtype))
