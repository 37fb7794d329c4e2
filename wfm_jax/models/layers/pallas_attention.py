"""The TPU kernel "auto" picks on TPU: JAX's Pallas flash attention
(jax.experimental.pallas.ops.tpu.flash_attention), which keeps no S x S buffer either way.

Kept deliberately thin: the kernel wants (B, N, S, H) and sequences in multiples of its 128-row
blocks, so the sequences are padded and the padded keys put in another segment than every query
(segment ids), the padded queries sliced off. heads_first_attention takes that layout as it is;
pallas_tpu_attention transposes (B, T, N, H) into it and back.

Under a mesh it must run inside shard_map (Mosaic kernels are not partitioned automatically) with
check_vma=False (context_parallel.shard_map says why). Tested on CPU in Pallas' TPU interpret mode,
alone and under an 8-device mesh (tests/models/layers/test_pallas_sharded.py), and compiled by the
real TPU compiler for a v5p topology (test_tpu_compile.py); not yet run on TPU hardware.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

TPU_BLOCK = 128


def pallas_tpu_available() -> bool:
    try:
        import jax.experimental.pallas.ops.tpu.flash_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _pad(x, n):
    """(B, N, T, H) with T padded to a multiple of n."""
    pad = -x.shape[2] % n
    return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else x


def pallas_tpu_attention(q, k, v, kv_mask=None):
    """(B, T, N, H) q, (B, S, N, H) k, v -> (B, T, N, H); keys where kv_mask (S,) is False are
    ignored."""
    out = heads_first_attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), kv_mask)
    return out.transpose(0, 2, 1, 3)


def heads_first_attention(q, k, v, kv_mask=None):
    """The kernel in its own layout: (B, N, T, H) q, (B, N, S, H) k, v -> (B, N, T, H). A model
    that projects into this layout and out of it directly (layers/attention.py's Attention on
    the Pallas path) saves the transposes pallas_tpu_attention makes around the kernel."""
    from jax.experimental.pallas.ops.tpu.flash_attention import SegmentIds, flash_attention
    b, _, t, h = q.shape
    s = k.shape[2]
    qp, kp, vp = (_pad(x, TPU_BLOCK) for x in (q, k, v))
    segments = None
    if kv_mask is not None or kp.shape[2] != s:
        valid = jnp.arange(kp.shape[2]) < s
        if kv_mask is not None:
            valid = valid & jnp.pad(kv_mask.astype(bool), (0, kp.shape[2] - s))
        kv_seg = jnp.broadcast_to(jnp.where(valid, 0, 1).astype(jnp.int32), (b, kp.shape[2]))
        segments = SegmentIds(q=jnp.zeros((b, qp.shape[2]), jnp.int32), kv=kv_seg)
    out = flash_attention(qp, kp, vp, segment_ids=segments, sm_scale=1.0 / math.sqrt(h))
    return out[:, :, :t]
