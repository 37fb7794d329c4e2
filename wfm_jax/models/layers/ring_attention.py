"""Ring attention: softmax attention of a device's query shard over keys and values split along
the sequence across mesh axes, without gathering them.

Runs inside `shard_map`. Each of the n devices holds one chunk of q, k, v; the K/V chunks (and
their key masks) travel round the ring with `lax.ppermute`, and each device attends its queries
to the chunk it holds (blockwise_attention.attend, so no chunk x chunk buffer either) and merges
the partial outputs by their log-sum-exp. The rotation of the next chunk is issued before the
compute on the current one, with no data dependence between them, so XLA may overlap transfer
and compute; the last chunk is not sent on.

Backward: a custom_vjp, not autodiff through the ring (which would keep every visiting K/V
chunk, i.e. the whole sequence's K/V, per device). It saves the local q, k, v, output and
log-sum-exp, and runs the ring again: K/V chunks rotate with their dK/dV accumulators, each
device adds its queries' contribution, and after n hops the accumulators are home.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from wfm_jax.models.layers.blockwise_attention import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    attend,
    attend_grads,
    row_delta,
    zero_like,
)


def axes_size(axes) -> int:
    return math.prod(jax.lax.axis_size(a) for a in axes)


def _rotate(axes):
    n = axes_size(axes)
    perm = [(i, (i + 1) % n) for i in range(n)]
    return lambda x: jax.lax.ppermute(x, axes, perm)


def merge(o1, lse1, o2, lse2):
    """Two partial attentions of the same queries over disjoint keys -> the one over both.
    o (B, T, N, H) float32, lse (B, N, T); an empty part has lse -inf and weight 0."""
    lse = jnp.logaddexp(lse1, lse2)
    safe = jnp.where(jnp.isneginf(lse), 0.0, lse)

    def weight(part):
        return jnp.exp(part - safe).transpose(0, 2, 1)[..., None]

    return o1 * weight(lse1) + o2 * weight(lse2), lse


def _forward(q, k, v, kv_mask, axes, block_q, block_k):
    rot = _rotate(axes)
    blocks = dict(block_q=block_q, block_k=block_k)

    def step(carry, _):
        out, lse, kc, vc, mc = carry
        sent = rot(kc), rot(vc), rot(mc)  # in flight while this chunk is attended
        return (*merge(out, lse, *attend(q, kc, vc, mc, **blocks)), *sent), None

    z = zero_like(q, k, v)
    lse = jnp.full((q.shape[0], q.shape[2], q.shape[1]), -jnp.inf, jnp.float32) + z
    init = (jnp.zeros(q.shape, jnp.float32) + z, lse, k, v, kv_mask)
    (out, lse, kc, vc, mc), _ = jax.lax.scan(step, init, None, length=axes_size(axes) - 1)
    return merge(out, lse, *attend(q, kc, vc, mc, **blocks))  # the last chunk stays put


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def ring_attention(q, k, v, kv_mask, axes, block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K):
    """Local shards q (B, t, N, H), k, v (B, s, N, H), kv_mask (s,) bool -> this shard's output
    (B, t, N, H) in q's dtype, attended over the keys of every shard along `axes` (a tuple of
    mesh axis names; call inside shard_map)."""
    return _forward(q, k, v, kv_mask, axes, block_q, block_k)[0].astype(q.dtype)


def _ring_fwd(q, k, v, kv_mask, axes, block_q, block_k):
    out, lse = _forward(q, k, v, kv_mask, axes, block_q, block_k)
    out = out.astype(q.dtype)
    return out, (q, k, v, kv_mask, out, lse)


def _ring_bwd(axes, block_q, block_k, res, dout):
    q, k, v, kv_mask, out, lse = res
    rot = _rotate(axes)
    delta = row_delta(out, dout)

    def grads(kc, vc, mc):
        return attend_grads(q, kc, vc, mc, lse, delta, dout, block_q=block_q, block_k=block_k)

    def step(carry, _):
        dq, kc, vc, mc, dkc, dvc = carry
        gq, gk, gv = grads(kc, vc, mc)
        # the chunk moves on with its gradient accumulators
        return (dq + gq, rot(kc), rot(vc), rot(mc), rot(dkc + gk), rot(dvc + gv)), None

    z = zero_like(q, k, v, dout)
    zeros = jnp.zeros(k.shape, jnp.float32) + z
    init = (jnp.zeros(q.shape, jnp.float32) + z, k, v, kv_mask, zeros, zeros)
    (dq, kc, vc, mc, dkc, dvc), _ = jax.lax.scan(step, init, None, length=axes_size(axes) - 1)
    gq, gk, gv = grads(kc, vc, mc)
    dk, dv = rot(dkc + gk), rot(dvc + gv)  # the last hop brings each chunk's gradient home
    return (dq + gq).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_attention.defvjp(_ring_fwd, _ring_bwd)
