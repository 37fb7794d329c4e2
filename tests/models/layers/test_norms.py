"""layers/norms.py and layers/modulation.py: the fp32 arithmetic torch uses, each as one
checkpoint that keeps its compute-dtype input and per-row statistics, never an
activation-sized fp32 array, for the backward; values and gradients those of plain autodiff."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from wfm_jax.models.layers.modulation import gated_residual, modulate
from wfm_jax.models.layers.norms import LayerNorm, RMSNorm, norm_checkpoints

B, T, D = 2, 8, 32


def _plain_layer_norm(x, scale, bias, eps):  # an independent fp32 reference, no checkpoint
    f = x.astype(jnp.float32)
    y = (f - f.mean(-1, keepdims=True)) / jnp.sqrt(f.var(-1, keepdims=True) + eps)
    return y * scale + bias


def _plain_rms_norm(x, scale, eps):
    f = x.astype(jnp.float32)
    return f / jnp.sqrt(jnp.mean(f * f, -1, keepdims=True) + eps) * scale


def _inputs(dtype=jnp.float32, seed=0):
    r = np.random.default_rng(seed)
    return (jnp.asarray(r.normal(1.0, 2.0, (B, T, D)), dtype),
            jnp.asarray(r.normal(1.0, 0.2, (D,)), jnp.float32),
            jnp.asarray(r.normal(0.0, 0.2, (D,)), jnp.float32))


def _norm(kind, scale, bias):
    n = LayerNorm(D, eps=1e-6) if kind == "layer" else RMSNorm(D, eps=1e-6)
    n.scale[...] = scale
    if kind == "layer":
        n.bias[...] = bias
    return n


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_values_and_gradients_are_plain_autodiffs(kind):
    x, scale, bias = _inputs()
    graph, state = nnx.split(_norm(kind, scale, bias))
    w = jnp.asarray(np.random.default_rng(1).normal(size=(B, T, D)), jnp.float32)

    def ours(s, x):
        return jnp.sum(nnx.merge(graph, s)(x) * w)

    def plain(scale, bias, x):
        y = (_plain_layer_norm(x, scale, bias, 1e-6) if kind == "layer"
             else _plain_rms_norm(x, scale, 1e-6))
        return jnp.sum(y * w)
    got_v, (got_s, got_x) = jax.value_and_grad(ours, argnums=(0, 1))(state, x)
    want_v, (want_scale, want_bias, want_x) = jax.value_and_grad(plain, argnums=(0, 1, 2))(
        scale, bias, x)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_s["scale"][...], want_scale, rtol=1e-4, atol=1e-5)
    if kind == "layer":
        np.testing.assert_allclose(got_s["bias"][...], want_bias, rtol=1e-4, atol=1e-5)


def _fp32_activations(fn, *args):
    """Residuals the backward keeps that are fp32 and activation-sized (B, T, D)."""
    return [(aval, src) for aval, src in saved_residuals(fn, *args)
            if aval.dtype == jnp.float32 and aval.size >= B * T * D]


def test_bf16_norms_and_modulation_keep_no_fp32_activation():
    x, scale, bias = _inputs(jnp.bfloat16)
    shift, mod_scale, gate = (jnp.asarray(np.random.default_rng(i).normal(0, 0.1, (B, D)),
                                          jnp.float32) for i in (2, 3, 4))
    ln, rms = _norm("layer", scale, bias), _norm("rms", scale, bias)
    plain_ln = lambda x: jnp.sum(_plain_layer_norm(x, scale, bias, 1e-6))
    assert _fp32_activations(plain_ln, x)  # the test can fail: plain autodiff keeps them
    for fn in (lambda x: jnp.sum(ln(x).astype(jnp.float32)),
               lambda x: jnp.sum(rms(x).astype(jnp.float32)),
               lambda x: jnp.sum(modulate(ln, x, shift, mod_scale, jnp.bfloat16)
                                 .astype(jnp.float32)),
               lambda x: jnp.sum(gated_residual(x, gate, x * 2).astype(jnp.float32))):
        assert _fp32_activations(fn, x) == []


def test_norm_checkpoints_off_keeps_plain_autodiffs_residuals_and_its_numbers():
    """Inside norm_checkpoints(False) each helper is its plain body: autodiff keeps its fp32
    activations again (what the checkpoints avoid), and values and gradients equal the
    checkpointed ones."""
    x, scale, bias = _inputs(jnp.bfloat16)
    shift, mod_scale = (jnp.asarray(np.random.default_rng(i).normal(0, 0.1, (B, D)), jnp.float32)
                        for i in (2, 3))
    ln = _norm("layer", scale, bias)
    w = jnp.asarray(np.random.default_rng(5).normal(size=(B, T, D)), jnp.float32)
    out = lambda x: modulate(ln, x, shift, mod_scale, jnp.bfloat16).astype(jnp.float32)
    summed, weighted = (lambda x: jnp.sum(out(x))), (lambda x: jnp.sum(out(x) * w))
    with norm_checkpoints(False):
        assert _fp32_activations(summed, x)
        off = jax.value_and_grad(weighted)(x)
    assert _fp32_activations(summed, x) == []  # the default again once the block is left
    on = jax.value_and_grad(weighted)(x)
    np.testing.assert_allclose(off[0], on[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(off[1], np.float32), np.asarray(on[1], np.float32),
                               rtol=1e-5, atol=1e-5)
