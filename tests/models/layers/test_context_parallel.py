"""Context parallelism on the XLA path: with the tokens split over `context` (2, 4 and 8 of the
8 simulated CPU devices, the rest on `data`), Ulysses and ring attention give the single-device
attention, forward and gradients, for self-, SD3 joint and Wan cross-attention, and the tiny SD3
and Wan transformers give their single-device forward.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (the tests skip on fewer devices).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests import _tiny_sd3
from wfm_jax.core import mesh as wmesh
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import assign, flat_shapes
from wfm_jax.models.layers.attention import cross_attention, dot_product_attention, joint_attention
from wfm_jax.models.layers.context_parallel import resolve_context_parallel
from wfm_jax.models.sd3.transformer import SD3Transformer
from wfm_jax.models.wan import WanTransformer

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
ATOL = 2e-5
CONTEXTS = (2, 4, 8)


def _mesh(n):
    return wmesh.make_mesh(data=8 // n, context=n)


def _arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


# -------------------------------------------------------------- the attention functions alone
# B = 4 (data splits it 4, 2 or 1 ways), 4 heads (Ulysses for context 2 and 4; 8 takes the ring),
# 20 image tokens (uneven over 8: padded and masked), 6 text tokens (uneven over 4 and 8).
B, T, L, N, H = 4, 20, 6, 4, 8


def _self(impl, scheme):
    def f(q, k, v):
        return (dot_product_attention(q, k, v, implementation=impl, context_parallel=scheme),)
    return f


def _joint(impl, scheme):
    def f(qs, ks, vs, qc, kc, vc):
        return joint_attention((qs, ks, vs), (qc, kc, vc), implementation=impl,
                               context_parallel=scheme)
    return f


def _cross(impl, scheme):
    def f(q, k, v):
        return (cross_attention(q, k, v, implementation=impl, context_parallel=scheme),)
    return f


KINDS = {
    "self": (_self, [(B, T, N, H)] * 3),
    "joint": (_joint, [(B, T, N, H)] * 3 + [(B, L, N, H)] * 3),
    "cross": (_cross, [(B, T, N, H)] + [(B, L, N, H)] * 2),
}


def _outputs_and_grads(fn, args, weights):
    def loss(*a):
        return sum(jnp.sum(o * w) for o, w in zip(fn(*a), weights))
    return fn(*args), jax.grad(loss, argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("n", CONTEXTS)
@pytest.mark.parametrize("impl, scheme", [("xla", "ulysses"), ("xla", "ring"),
                                          ("blockwise", "ulysses"), ("blockwise", "auto")])
def test_attention_split_over_context_equals_one_device(kind, n, impl, scheme):
    make, shapes = KINDS[kind]
    args = _arrays(shapes)
    n_out = 2 if kind == "joint" else 1
    weights = _arrays([shapes[0], shapes[-1]][:n_out], seed=1)
    want_out, want_grads = jax.jit(lambda *a: _outputs_and_grads(make("xla", "auto"), a,
                                                                 weights))(*args)
    if scheme == "ulysses" and N % n and kind != "cross":
        with jax.set_mesh(_mesh(n)), pytest.raises(ValueError, match="must divide by 8"):
            jax.jit(make(impl, scheme))(*args)
        return
    step = wmesh.mesh_jit(lambda *a: _outputs_and_grads(make(impl, scheme), a, weights),
                          mesh=_mesh(n))
    got_out, got_grads = step(*args)
    for got, want in zip(got_out + got_grads, want_out + want_grads):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["joint", "cross"])
def test_batch_smaller_than_its_shards_is_padded(kind):
    # B = 1 on data=4: shard_map needs even shards, so the batch is padded and sliced off
    make, shapes = KINDS[kind]
    args = [a[:1] for a in _arrays(shapes)]
    want = jax.jit(make("xla", "auto"))(*args)
    got = wmesh.mesh_jit(make("blockwise", "ring"), mesh=_mesh(2))(*args)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


def test_auto_takes_ulysses_when_the_heads_divide_else_ring():
    with jax.set_mesh(_mesh(4)):
        assert resolve_context_parallel("auto", 8, ("context",)) == "ulysses"
        assert resolve_context_parallel("auto", 6, ("context",)) == "ring"
        assert resolve_context_parallel("ring", 8, ("context",)) == "ring"
        with pytest.raises(ValueError, match="the 6 attention heads must divide by 4; use"):
            resolve_context_parallel("ulysses", 6, ("context",))
        with pytest.raises(ValueError, match="context_parallel_impl must be one of"):
            resolve_context_parallel("tree", 8, ("context",))
    for build in (lambda: SD3Transformer(_tiny_sd3.CONFIG, rngs=nnx.Rngs(0),
                                         context_parallel_impl="tree"),
                  lambda: WanTransformer(WAN, rngs=nnx.Rngs(0), context_parallel_impl="tree")):
        with pytest.raises(ValueError, match="context_parallel_impl must be one of"):
            abstract_module(build)


def test_ring_sends_kv_with_ppermute_and_ulysses_with_all_to_all():
    q, k, v = _arrays([(B, T, N, H)] * 3)

    def hlo(scheme):
        f = wmesh.mesh_jit(_self("blockwise", scheme), mesh=_mesh(2))
        return f.lower(q, k, v).compile().as_text()

    ring, ulysses = hlo("ring"), hlo("ulysses")
    assert "collective-permute" in ring and "all-to-all" not in ring
    assert "all-to-all" in ulysses and "collective-permute" not in ulysses


# -------------------------------------------------------------- the tiny transformers


def _redraw(model, seed=1, scale=0.1):
    rng = np.random.default_rng(seed)  # zero-init layers would hide a wrong attention
    assign(model, {k: scale * rng.standard_normal(s).astype(np.float32)
                   for k, s in sorted(flat_shapes(model).items())})
    return model


def _sd3(impl="xla", scheme="auto"):
    model = SD3Transformer(_tiny_sd3.CONFIG, rngs=nnx.Rngs(0), attention_impl=impl,
                           context_parallel_impl=scheme)
    return _redraw(model)


WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
           out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2,
           cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)


def _wan(impl="xla", scheme="auto"):
    model = WanTransformer(WAN, rngs=nnx.Rngs(0), attention_impl=impl,
                           context_parallel_impl=scheme)
    return _redraw(model)


def _wan_inputs(batch, seed=0):
    rng = np.random.default_rng(seed)  # grid (4, 4, 3): 48 video tokens; 7 text tokens
    return (rng.standard_normal((batch, 4, 4, 8, 6)).astype(np.float32),
            np.linspace(3, 990, batch).astype(np.float32),
            rng.standard_normal((batch, 7, 16)).astype(np.float32))


def _forward(model, inputs, mesh=None):
    graphdef, state = nnx.split(model)

    def f(state, *a):
        return nnx.merge(graphdef, state)(*a)

    if mesh is None:
        return jax.jit(f)(state, *inputs)
    return wmesh.mesh_jit(f, mesh=mesh)(state, *inputs)


@pytest.mark.parametrize("n, impl, scheme", [(2, "xla", "auto"), (4, "blockwise", "ring"),
                                             (8, "xla", "auto")])
def test_tiny_sd3_forward_split_over_context(n, impl, scheme):
    # 4 heads: context 2 runs Ulysses, 8 the ring; 24 image + 6 text tokens (text uneven)
    inputs = _tiny_sd3.inputs(batch=8 // n)
    want = _forward(_sd3(), inputs)
    got = _forward(_sd3(impl, scheme), inputs, _mesh(n))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("n, impl, scheme", [(2, "xla", "auto"), (4, "blockwise", "auto"),
                                             (8, "xla", "ring")])
def test_tiny_wan_forward_split_over_context(n, impl, scheme):
    # 2 heads: context 2 runs Ulysses, 4 and 8 the ring; cross-attention to the 7 text tokens
    inputs = _wan_inputs(8 // n)
    want = _forward(_wan(), inputs)
    got = _forward(_wan(impl, scheme), inputs, _mesh(n))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_tiny_sd3_gradient_split_over_context():
    inputs = _tiny_sd3.inputs(batch=2)
    model = _sd3()

    def grads(mesh):
        graphdef, state = nnx.split(model)

        def loss(state, *a):
            return jnp.sum(nnx.merge(graphdef, state)(*a) ** 2)

        fn = jax.grad(loss)
        return jax.jit(fn)(state, *inputs) if mesh is None else \
            wmesh.mesh_jit(fn, mesh=mesh)(state, *inputs)

    want = grads(None)
    got = grads(wmesh.make_mesh(data=1, context=8))  # ring over 8
    for (path, g), (_, w) in zip(jax.tree_util.tree_leaves_with_path(got),
                                 jax.tree_util.tree_leaves_with_path(want)):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4, err_msg=str(path))


def test_context_parallel_backward_holds_no_s_by_s_buffer():
    # per device at 4096 tokens on context=2: the XLA kernel under Ulysses keeps its softmax
    # (one head x 4096 x 4096 fp32 = 64 MiB); blockwise Ulysses and the ring keep O(S) state
    q = jnp.zeros((4, 4096, 2, 32), jnp.float32)
    scores = 1 * 1 * 4096 * 4096 * 4

    def temp(impl, scheme):
        f = wmesh.mesh_jit(jax.grad(lambda q, k, v: jnp.sum(dot_product_attention(
            q, k, v, implementation=impl, context_parallel=scheme)), argnums=(0, 1, 2)),
            mesh=_mesh(2))
        return f.lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    assert temp("xla", "ulysses") > scores
    assert temp("blockwise", "ulysses") < scores / 4
    assert temp("blockwise", "ring") < scores / 4
