"""The Pallas TPU flash-attention path under an 8-device mesh, run on CPU by Pallas' TPU
interpreter: forward and gradients against XLA attention on one device, with the sequence unsplit
(shard_map over the batch), split with Ulysses (all-to-all to a heads split, padded keys masked),
split with the ring (which attends its chunks blockwise whatever the kernel), and
cross-attention to K/V every sequence shard holds (local queries).

Why the shapes are so small (the interpreter hang). Each interpreted kernel step is a
`jax.experimental.io_callback`; on CPU its implementation device_puts the callback's operands
onto CPU device 0 and the interpreter reads them back with `np.array`. XLA's CPU client copies a
host buffer of less than 100 KiB inline (kSmallDataTransferByteSize) and hands a larger one to
an asynchronous copy; under a multi-device program that copy never completes while the devices'
threads sit in interpreter callbacks (the interpreter also holds every device at a barrier
before a kernel's first step), so the run stops with idle CPU: gdb shows one thread per device
parked in PyArray_bf_getbuffer -> BlockUntilReady, the rest of XLA's pool idle. Measured: on 8
devices a forward whose per-device q is 64 KiB runs and 128 KiB hangs; on 2 devices 512 KiB
hangs; a 1-device mesh runs at 2 MiB; replacing that device_put by np.asarray (patching jax)
makes the hanging 8-device backward run in 15 s. The flash backward allocates its log-sum-exp
residuals as (B, N, S, 128) fp32, so B x N x S per device (S padded to 128) must stay under 200:
`_check_interpretable` refuses larger cases with this explanation instead of hanging. It is a
limit of the CPU interpreter, not of the kernel.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (skips on fewer devices).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests._support.attention import record_heads_first
from wfm_jax.core import mesh as wmesh
from wfm_jax.models.layers import context_parallel as cp
from wfm_jax.models.layers.attention import cross_attention, dot_product_attention, joint_attention
from wfm_jax.models.layers.pallas_attention import TPU_BLOCK, pallas_tpu_attention

pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
ATOL = 2e-5
INTERPRETER_INLINE_COPY = 100 * 1024  # XLA CPU's kSmallDataTransferByteSize


def _check_interpretable(batch, heads, seq):
    """Per device: the flash backward's (B, N, S, 128) fp32 residuals must stay below the CPU
    client's inline copy size, or the interpreter deadlocks (module docstring)."""
    padded = -(-seq // TPU_BLOCK) * TPU_BLOCK
    lse_bytes = batch * heads * padded * TPU_BLOCK * 4
    assert lse_bytes < INTERPRETER_INLINE_COPY, (
        f"{lse_bytes} bytes per interpreter buffer: the Pallas TPU interpreter hangs on CPU "
        "meshes from 100 KiB (see this module's docstring); use fewer rows per device")


def _arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def _outputs_and_grads(fn, args, weights):
    def loss(*a):
        return sum(jnp.sum(o * w) for o, w in zip(fn(*a), weights, strict=True))
    return fn(*args), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


def _split_perturbed(module):
    """(graphdef, params) of `module`, every parameter moved off its initial value (LoRA's zero B
    included, so its gradients flow through both factors)."""
    from flax import nnx
    graphdef, params = nnx.split(module)
    return graphdef, jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(3), p.shape), params)


def _assert_grads_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=1e-5)


def _xla(q, k, v, kv_mask=None):
    mask = None if kv_mask is None else kv_mask[None, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def _compare(fn, ref, args, n_out, mesh):
    weights = _arrays([args[0].shape] * n_out, seed=1)
    if n_out == 2:  # joint: the second output is the context part
        weights[1] = _arrays([args[3].shape], seed=2)[0]
    want_out, want_grads = jax.jit(lambda *a: _outputs_and_grads(ref, a, weights))(*args)
    with pltpu.force_tpu_interpret_mode():
        step = wmesh.mesh_jit(lambda *a: _outputs_and_grads(fn, a, weights), mesh=mesh)
        got_out, got_grads = step(*args)
    assert len(got_grads) == len(args)
    for got, want in zip(got_out + got_grads, want_out + want_grads, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_pallas_under_shard_map_needs_the_vma_check_off():
    # why context_parallel.shard_map turns check_vma off for Pallas: JAX's TPU kernels declare
    # outputs without a varying-axes type (if this stops raising, the workaround may go)
    q = jnp.zeros((8, 16, 1, 8))
    m = wmesh.make_mesh(data=8)
    spec = P(("data", "fsdp"), None, None, None)
    fn = jax.shard_map(lambda q: pallas_tpu_attention(q, q, q), mesh=m, in_specs=spec,
                       out_specs=spec)
    with pltpu.force_tpu_interpret_mode(), pytest.raises(ValueError, match="manual_axis_type"):
        jax.jit(fn).lower(q)


def test_sequence_unsplit_shard_map_over_the_batch():
    # data=8: sharded_local_attention, one (batch row, head) per device
    b, t, n, h = 8, 40, 1, 8
    _check_interpretable(b // 8, n, t)
    args = _arrays([(b, t, n, h)] * 3)

    def fn(q, k, v):
        return (dot_product_attention(q, k, v, implementation="pallas"),)

    _compare(fn, lambda q, k, v: (_xla(q, k, v),), args, 1, wmesh.make_mesh(data=8))


def test_key_padding_mask_under_the_mesh():
    # the kernel's own key mask (segment ids), with queries and keys of other lengths
    b, t, s, n, h = 8, 24, 50, 1, 8
    _check_interpretable(b // 8, n, max(t, s))
    args = _arrays([(b, t, n, h), (b, s, n, h), (b, s, n, h)])
    mask = jnp.arange(s) % 3 != 1
    m = wmesh.make_mesh(data=8)
    spec = P(("data", "fsdp"), None, None, None)

    def fn(q, k, v):
        local = cp.shard_map(lambda q, k, v, mk: pallas_tpu_attention(q, k, v, mk), impl="pallas",
                             in_specs=(spec,) * 3 + (P(),), out_specs=spec)
        return (local(q, k, v, mask),)

    _compare(fn, lambda q, k, v: (_xla(q, k, v, mask),), args, 1, m)


# context 2 of data 4 x context 2: Ulysses moves the 2 heads to one per device; 21 image and 5 text
# tokens do not divide by 2, so each part is padded and its padded key masked
B, T, L, N, H = 4, 21, 5, 2, 8


@pytest.mark.parametrize("scheme", ["ulysses", "ring"])
def test_self_attention_split_over_context(scheme):
    _check_interpretable(B // 4, N // 2, T + 1)
    args = _arrays([(B, T, N, H)] * 3)

    def fn(q, k, v):
        return (dot_product_attention(q, k, v, implementation="pallas", context_parallel=scheme),)

    _compare(fn, lambda q, k, v: (_xla(q, k, v),), args, 1, wmesh.make_mesh(data=4, context=2))


def test_joint_attention_ulysses_two_padded_parts():
    _check_interpretable(B // 4, N // 2, T + L + 2)
    args = _arrays([(B, T, N, H)] * 3 + [(B, L, N, H)] * 3)

    def fn(*a):
        return joint_attention(a[:3], a[3:], implementation="pallas", context_parallel="ulysses")

    def ref(qs, ks, vs, qc, kc, vc):
        q, k, v = (jnp.concatenate(p, axis=1) for p in ((qs, qc), (ks, kc), (vs, vc)))
        out = _xla(q, k, v)
        return out[:, :T], out[:, T:]

    _compare(fn, ref, args, 2, wmesh.make_mesh(data=4, context=2))


def test_cross_attention_local_queries_sums_replicated_kv_gradients():
    # K/V replicated over the sequence split: their gradient is the sum over the query shards
    # (shard_map's transpose does it with the check off, pcast's psum with it on)
    n = 1
    _check_interpretable(B // 4, n, T)
    args = _arrays([(B, T, n, H), (B, L, n, H), (B, L, n, H)])

    def fn(q, k, v):
        return (cross_attention(q, k, v, implementation="pallas"),)

    _compare(fn, lambda q, k, v: (_xla(q, k, v),), args, 1, wmesh.make_mesh(data=4, context=2))


@pytest.mark.parametrize("joint,lora", [(True, False), (False, False), (True, True)])
def test_attention_in_the_kernels_layout_equals_xla_attention(joint, lora, monkeypatch):
    # Attention on the Pallas path with the sequence unsplit projects straight into the kernel's
    # (B, N, T, H) layout and out of it (cp.sharded_heads_first_attention): its outputs and the
    # gradients of its weights and inputs against the same module on XLA attention, one device;
    # with LoRA on every projection (the NFT recipes), its A and B gradients too
    from flax import nnx

    from wfm_jax.models.layers.attention import Attention
    b, t, l, dim = 8, 40, 7, 16
    _check_interpretable(b // 8, 1, t + l)
    module = Attention(dim, 1, 8, rngs=nnx.Rngs(0), added_kv_proj_dim=12 if joint else None,
                       qk_norm="rms_norm", attention_impl="xla")
    if lora:
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"):
            getattr(module, name).add_lora(4, 8.0, nnx.Rngs(1))
        module.to_out[0].add_lora(4, 8.0, nnx.Rngs(2))
    graphdef, params = _split_perturbed(module)
    x, c = _arrays([(b, t, dim), (b, l, 12)])
    weights = _arrays([(b, t, dim), (b, l, dim)], seed=1)
    taken = record_heads_first(monkeypatch)

    def loss(params, x, c, impl):
        m = nnx.merge(graphdef, params)
        m.attention_impl = impl
        out = m(x, c) if joint else (m(x),)
        return sum(jnp.sum(o * w) for o, w in zip(out, weights, strict=False))

    want = jax.jit(jax.value_and_grad(lambda *a: loss(*a, "xla"), argnums=(0, 1, 2)))(params, x, c)
    with pltpu.force_tpu_interpret_mode():
        step = wmesh.mesh_jit(jax.value_and_grad(lambda *a: loss(*a, "pallas"), argnums=(0, 1, 2)),
                              mesh=wmesh.make_mesh(data=8))
        got = step(params, x, c)
    assert taken  # the kernel's layout, not the transposing wrapper
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # a sum over 5120 outputs
    # the LoRA weights' gradients reach |g| ~ 40 here, where fp32 sums over 5120 terms in two
    # orders differ by a few 1e-6 relative (2.3e-5 absolute on CI's AVX2 host): bound both
    _assert_grads_close(got[1], want[1])


@pytest.mark.parametrize("cross,lora,heads", [(False, True, 1), (True, False, 1), (False, False, 2)])
def test_cosmos_attention_in_the_kernels_layout_equals_xla_attention(cross, lora, heads, monkeypatch):
    # Cosmos' attention on the Pallas path with the sequence unsplit: q, k, v projected into the
    # kernel's (B, N, T, H) layout, the per-head q and k norms and the RoPE there, the output
    # projection contracting it. Outputs and gradients (weights, LoRA, inputs) against the same
    # module on XLA attention. One head under the 8-device mesh (the interpreter's limit, module
    # docstring); two heads on one device.
    from flax import nnx

    from wfm_jax.models.cosmos.attention import CosmosAttention
    from wfm_jax.models.cosmos.rope import rope_tables
    b, grid, l, dim, head_dim = 8, (2, 4, 5), 7, 16, 12  # Cosmos' RoPE needs a head_dim of 12 at least
    t = grid[0] * grid[1] * grid[2]
    module = CosmosAttention(dim, heads, head_dim, rngs=nnx.Rngs(0), attention_impl="xla")
    if lora:
        for lin in (module.to_q, module.to_k, module.to_v, module.to_out[0]):
            lin.add_lora(4, 8.0, nnx.Rngs(1))
    graphdef, params = _split_perturbed(module)
    x, c = _arrays([(b, t, dim), (b, l, dim)])
    weights = _arrays([(b, t, dim)], seed=1)[0]
    rope = None if cross else tuple(jnp.asarray(a) for a in rope_tables(head_dim, grid, max(grid)))
    taken = record_heads_first(monkeypatch)

    def loss(params, x, c, impl):
        m = nnx.merge(graphdef, params)
        m.attention_impl = impl
        return jnp.sum(m(x, c if cross else None, rope) * weights)

    want = jax.jit(jax.value_and_grad(lambda *a: loss(*a, "xla"), argnums=(0, 1, 2)))(params, x, c)
    grad = jax.value_and_grad(lambda *a: loss(*a, "pallas"), argnums=(0, 1, 2))
    with pltpu.force_tpu_interpret_mode():
        if heads == 1:
            _check_interpretable(b // 8, heads, max(t, l))
            got = wmesh.mesh_jit(grad, mesh=wmesh.make_mesh(data=8))(params, x, c)
        else:
            got = jax.jit(grad)(params, x, c)
    assert bool(taken) == (heads == 1)  # under the mesh: the kernel's layout, no transposing wrapper
    # a weighted sum of 5120 outputs near 1 in size that nearly cancel: fp32 in two orders
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=0)
    _assert_grads_close(got[1], want[1])
