"""Blockwise (flash-style) softmax attention in plain JAX: no [B, N, T, S] buffer, forward or
backward.

Queries are taken `block_q` rows at a time and keys `block_k` columns at a time with a running
max and sum (online softmax), so the largest temporary is one [B, N, block_q, block_k] score
tile. The backward (custom_vjp) recomputes the tiles from q, k, v and the saved log-sum-exp,
FlashAttention-2 order: the saved state is the output and the log-sum-exp, O(S) per head.

Scores, the softmax and every accumulation are float32 whatever the input dtype; the
probabilities meet v (and the score gradients meet q and k) in the input dtype, as flash kernels
do. Sequences that do not divide the blocks are padded; padded keys are masked, padded queries
sliced off. `kv_mask` (bool, (S,), shared by the batch and heads) masks further keys: the
context-parallel layouts use it for their own padding.

`attend` and `attend_grads` are the two halves without the custom_vjp, for ring attention, which
merges per-chunk outputs by their log-sum-exp.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

F32 = jnp.float32
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512


def _blocks(x, block):
    """(B, L, N, H) -> (L / block, B, N, block, H), L padded up to a multiple of block."""
    b, n_tok, n, h = x.shape
    pad = -n_tok % block
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return x.reshape(b, -1, block, n, h).transpose(1, 0, 3, 2, 4)


def _unblocks(x, length):
    """Inverse of _blocks: (L' / block, B, N, block, H) -> (B, length, N, H)."""
    nb, b, n, block, h = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, nb * block, n, h)[:, :length]


def _rows(x, block):
    """(B, N, L) per-query statistics -> (L / block, B, N, block), padded with zeros."""
    pad = -x.shape[-1] % block
    if pad:
        x = jnp.pad(x, ((0, 0), (0, 0), (0, pad)))
    b, n, _ = x.shape
    return x.reshape(b, n, -1, block).transpose(2, 0, 1, 3)


def _unrows(x, length):
    nb, b, n, block = x.shape
    return x.transpose(1, 2, 0, 3).reshape(b, n, nb * block)[..., :length]


def _key_mask(kv_mask, s, block):
    mask = jnp.ones((s,), bool) if kv_mask is None else kv_mask.astype(bool)
    return jnp.pad(mask, (0, -s % block)).reshape(-1, block)


def zero_like(*arrays):
    """A float32 0 that varies over every mesh axis any of `arrays` varies over (inside
    shard_map a loop carry must start as varying as what the loop adds to it)."""
    return sum(jnp.zeros_like(a.reshape(-1)[0], F32) for a in arrays)


def _sizes(q, k, block_q, block_k):
    return min(block_q, q.shape[1]), min(block_k, k.shape[1])


def _scores(qb, kb, mb, scale):
    s = jnp.einsum("bnqh,bnkh->bnqk", qb, kb, preferred_element_type=F32) * scale
    return jnp.where(mb[None, None, None, :], s, -jnp.inf)


def attend(q, k, v, kv_mask=None, *, block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K):
    """(B, T, N, H) x (B, S, N, H) -> out (B, T, N, H) float32, lse (B, N, T) float32.

    A query row whose keys are all masked gets out 0 and lse -inf (ring attention meets such
    chunks; its merge weights them by exp(lse))."""
    t, s = q.shape[1], k.shape[1]
    bq, bk = _sizes(q, k, block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1])
    kbs, vbs, mbs = _blocks(k, bk), _blocks(v, bk), _key_mask(kv_mask, s, bk)

    def one_query_block(qb):
        def step(carry, kvm):
            m, denom, acc = carry
            kb, vb, mb = kvm
            sc = _scores(qb, kb, mb, scale)
            m_new = jnp.maximum(m, sc.max(-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # all masked so far: no NaN
            p = jnp.exp(sc - m_safe[..., None])
            corr = jnp.exp(m - m_safe)
            denom = denom * corr + p.sum(-1)
            pv = jnp.einsum("bnqk,bnkh->bnqh", p.astype(v.dtype), vb, preferred_element_type=F32)
            return (m_new, denom, acc * corr[..., None] + pv), None

        shape, z = qb.shape[:-1], zero_like(qb, kbs, vbs)
        init = (jnp.full(shape, -jnp.inf, F32) + z, jnp.zeros(shape, F32) + z,
                jnp.zeros(qb.shape, F32) + z)
        (m, denom, acc), _ = jax.lax.scan(step, init, (kbs, vbs, mbs))
        seen = denom > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, denom, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, denom, 1.0)), -jnp.inf)
        return out, lse

    out, lse = jax.lax.map(one_query_block, _blocks(q, bq))
    return _unblocks(out, t), _unrows(lse, t)


def attend_grads(q, k, v, kv_mask, lse, delta, dout, *, block_q=DEFAULT_BLOCK_Q,
                 block_k=DEFAULT_BLOCK_K):
    """Gradients (dq, dk, dv, float32) of the attention of q over the keys k, v given the final
    per-query log-sum-exp `lse` (B, N, T) and delta = rowsum(dout * out) - d(lse) (B, N, T).

    With a chunk's keys but the lse over all keys (ring attention), these are that chunk's
    contributions: the softmax of one query row spans every chunk, and the lse carries it."""
    t, s = q.shape[1], k.shape[1]
    bq, bk = _sizes(q, k, block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qbs, dobs = _blocks(q, bq), _blocks(dout.astype(q.dtype), bq)
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)  # only padded/empty rows, whose p is 0
    lbs, dbs = _rows(lse_safe, bq), _rows(delta, bq)

    def one_key_block(dq, kvm):
        kb, vb, mb = kvm

        def step(acc, xs):
            dk, dv = acc
            qb, dob, lb, db, dqb = xs
            p = jnp.exp(_scores(qb, kb, mb, scale) - lb[..., None])
            dv = dv + jnp.einsum("bnqk,bnqh->bnkh", p.astype(dob.dtype), dob,
                                 preferred_element_type=F32)
            dp = jnp.einsum("bnqh,bnkh->bnqk", dob, vb, preferred_element_type=F32)
            ds = (p * (dp - db[..., None])).astype(q.dtype)
            dqb = dqb + jnp.einsum("bnqk,bnkh->bnqh", ds, kb, preferred_element_type=F32) * scale
            dk = dk + jnp.einsum("bnqk,bnqh->bnkh", ds, qb, preferred_element_type=F32) * scale
            return (dk, dv), dqb

        zeros = jnp.zeros(kb.shape, F32) + zero_like(q, k, v, dout, lse)
        (dk, dv), dq = jax.lax.scan(step, (zeros, zeros), (qbs, dobs, lbs, dbs, dq))
        return dq, (dk, dv)

    dq0 = jnp.zeros(qbs.shape, F32) + zero_like(q, k, v, dout, lse)
    kvm = (_blocks(k, bk), _blocks(v, bk), _key_mask(kv_mask, s, bk))
    dq, (dk, dv) = jax.lax.scan(one_key_block, dq0, kvm)
    return _unblocks(dq, t), _unblocks(dk, s), _unblocks(dv, s)


def row_delta(out, dout):
    """rowsum(dout * out) as (B, N, T) float32."""
    return jnp.einsum("btnh,btnh->bnt", dout.astype(F32), out.astype(F32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention_lse(q, k, v, kv_mask, block_q, block_k):
    out, lse = attend(q, k, v, kv_mask, block_q=block_q, block_k=block_k)
    return out.astype(q.dtype), lse


def _attention_lse_fwd(q, k, v, kv_mask, block_q, block_k):
    out, lse = attend(q, k, v, kv_mask, block_q=block_q, block_k=block_k)
    out = out.astype(q.dtype)
    return (out, lse), (q, k, v, kv_mask, out, lse)


def _attention_lse_bwd(block_q, block_k, res, cotangents):
    q, k, v, kv_mask, out, lse = res
    dout, dlse = cotangents
    delta = row_delta(out, dout) - dlse  # d lse / d score = p: folds into the same ds
    dq, dk, dv = attend_grads(q, k, v, kv_mask, lse, delta, dout, block_q=block_q,
                              block_k=block_k)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention_lse.defvjp(_attention_lse_fwd, _attention_lse_bwd)


def blockwise_attention_lse(q, k, v, kv_mask=None, *, block_q=DEFAULT_BLOCK_Q,
                            block_k=DEFAULT_BLOCK_K):
    """(out in q's dtype, lse float32 (B, N, T)), differentiable in both."""
    check_shapes(q, k, v, kv_mask)
    return _attention_lse(q, k, v, kv_mask, int(block_q), int(block_k))


def blockwise_attention(q, k, v, kv_mask=None, *, block_q=DEFAULT_BLOCK_Q,
                        block_k=DEFAULT_BLOCK_K):
    """Softmax attention over (B, T, N, H) q and (B, S, N, H) k, v, scale 1/sqrt(H); keys where
    kv_mask (S,) is False are ignored. Equals jax.nn.dot_product_attention (with that mask)."""
    return blockwise_attention_lse(q, k, v, kv_mask, block_q=block_q, block_k=block_k)[0]


def check_shapes(q, k, v, kv_mask=None) -> None:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[::2] != k.shape[::2] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention wants q (B, T, N, H) and k, v (B, S, N, H), got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if kv_mask is not None and kv_mask.shape != k.shape[1:2]:
        raise ValueError(f"kv_mask must have shape ({k.shape[1]},), got {kv_mask.shape}")
