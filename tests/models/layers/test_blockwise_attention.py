"""Blockwise (flash-style) attention: equal to the plain XLA path forward and backward, and its
compiled backward never holds an S x S buffer."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.models.layers.attention import dot_product_attention
from wfm_jax.models.layers.blockwise_attention import blockwise_attention, blockwise_attention_lse

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

ATOL = 2e-5


def _arrays(shapes, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


def _plain(q, k, v, kv_mask=None):
    mask = None if kv_mask is None else kv_mask[None, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def _value_and_grads(fn, q, k, v, w):
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w),
                                      argnums=(0, 1, 2)))(q, k, v)


# (B, T, S, N, H, block_q, block_k): blocks dividing, not dividing either length, one block
# longer than the sequence, cross-attention (T != S) both ways
SHAPES = [(2, 32, 32, 2, 8, 8, 16), (2, 37, 37, 3, 8, 16, 8), (1, 20, 13, 2, 16, 64, 4),
          (2, 9, 50, 2, 8, 4, 16), (1, 5, 5, 1, 4, 512, 512)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_blockwise_matches_the_plain_path_forward_and_backward(shape, masked):
    b, t, s, n, h, bq, bk = shape
    q, k, v, w = _arrays([(b, t, n, h), (b, s, n, h), (b, s, n, h), (b, t, n, h)])
    mask = None
    if masked:  # a random key mask that keeps the first key (every row attends to something)
        mask = jnp.asarray(np.random.default_rng(1).random(s) > 0.4).at[0].set(True)
    out = blockwise_attention(q, k, v, mask, block_q=bq, block_k=bk)
    assert out.dtype == q.dtype and out.shape == q.shape
    np.testing.assert_allclose(out, _plain(q, k, v, mask), atol=ATOL, rtol=0)
    (lb, gb), (lp, gp) = (_value_and_grads(fn, q, k, v, w) for fn in (
        lambda q, k, v: blockwise_attention(q, k, v, mask, block_q=bq, block_k=bk),
        lambda q, k, v: _plain(q, k, v, mask)))
    np.testing.assert_allclose(lb, lp, rtol=1e-5)
    for got, want in zip(gb, gp):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_log_sum_exp_output_and_its_gradient():
    # ring attention merges partial outputs by their lse; its cotangent must be right too
    q, k, v = _arrays([(1, 11, 2, 8), (1, 19, 2, 8), (1, 19, 2, 8)], seed=3)
    scale = 1 / np.sqrt(8)

    def plain_lse(q, k):
        return jax.nn.logsumexp(jnp.einsum("bthd,bshd->bhts", q, k) * scale, axis=-1)

    out, lse = blockwise_attention_lse(q, k, v, block_q=4, block_k=8)
    assert lse.dtype == jnp.float32 and lse.shape == (1, 2, 11)
    np.testing.assert_allclose(lse, plain_lse(q, k), atol=ATOL)
    wo, wl = _arrays([(1, 11, 2, 8), (1, 2, 11)], seed=4)

    def loss(attn, lse_fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v)[0] * wo) + jnp.sum(
            lse_fn(q, k, v) * wl), argnums=(0, 1, 2)))(q, k, v)

    got = loss(lambda q, k, v: blockwise_attention_lse(q, k, v, block_q=4, block_k=8),
               lambda q, k, v: blockwise_attention_lse(q, k, v, block_q=4, block_k=8)[1])
    want = loss(lambda q, k, v: (_plain(q, k, v),), lambda q, k, v: plain_lse(q, k))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


def test_bf16_inputs_accumulate_in_fp32():
    # bf16 in and out; scores, softmax and sums in fp32: as close to the fp32 answer on the same
    # bf16 inputs as XLA's own bf16 attention is (one bf16 rounding of the output, ~4e-3)
    q, k, v = _arrays([(2, 300, 2, 16), (2, 300, 2, 16), (2, 300, 2, 16)], dtype=jnp.bfloat16)
    exact = _plain(*(x.astype(jnp.float32) for x in (q, k, v)))
    out = blockwise_attention(q, k, v, block_q=64, block_k=64)
    assert out.dtype == jnp.bfloat16
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - exact)))
    xla_err = float(jnp.max(jnp.abs(_plain(q, k, v).astype(jnp.float32) - exact)))
    assert err <= max(xla_err, 8e-3), (err, xla_err)


def test_dispatch_selects_blockwise():
    q, k, v = _arrays([(1, 40, 2, 8)] * 3)
    out = dot_product_attention(q, k, v, implementation="blockwise")
    np.testing.assert_allclose(out, _plain(q, k, v), atol=ATOL, rtol=0)


def test_bad_shapes_are_one_line():
    q, k = _arrays([(1, 8, 2, 8), (1, 8, 3, 8)])
    with pytest.raises(ValueError, match=r"q \(B, T, N, H\) and k, v \(B, S, N, H\)"):
        blockwise_attention(q, k, k)
    with pytest.raises(ValueError, match=r"kv_mask must have shape \(8,\)"):
        blockwise_attention(q, q, q, jnp.ones((7,), bool))


def _temp_bytes(fn, q, k, v):
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
    return grad.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes


def test_compiled_backward_holds_no_s_by_s_buffer():
    b, s, n, h = 1, 4096, 2, 32
    q, k, v = _arrays([(b, s, n, h)] * 3)
    scores = b * n * s * s * 4  # one fp32 [B, N, S, S] matrix: 128 MiB
    blockwise = _temp_bytes(lambda q, k, v: blockwise_attention(q, k, v, block_q=256,
                                                                block_k=256), q, k, v)
    plain = _temp_bytes(_plain, q, k, v)
    assert plain > scores  # XLA keeps the softmax for its backward
    # what is left is O(S) per head (q/k/v in blocks, fp32 dq, dk, dv: ~9 MiB) and one tile
    assert blockwise < scores / 8, (blockwise, scores)


def test_pallas_tpu_kernel_in_interpret_mode():
    # what "auto" runs on TPU, here through Pallas' TPU interpreter: the padding to its 128-row
    # blocks and the key mask (segment ids) must not move the numbers
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    from wfm_jax.models.layers.pallas_attention import pallas_tpu_attention
    q, k, v, w = _arrays([(1, 40, 2, 8), (1, 50, 2, 8), (1, 50, 2, 8), (1, 40, 2, 8)])
    mask = jnp.arange(50) % 3 != 1
    with pltpu.force_tpu_interpret_mode():
        out, grads = _value_and_grads(lambda q, k, v: pallas_tpu_attention(q, k, v, mask),
                                      q, k, v, w)
    want, want_grads = _value_and_grads(lambda q, k, v: _plain(q, k, v, mask), q, k, v, w)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    for got, ref in zip(grads, want_grads):
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
