"""Linear.einsum: the layer's weights contracted in another layout give the layer's own output,
rearranged, with and without LoRA (attention's heads-first projections use it)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from wfm_jax.models.layers.linear import Linear, _lora_specs


def _layer(d_in, d_out, lora):
    lin = Linear(d_in, d_out, rngs=nnx.Rngs(0))
    if lora:
        lin.add_lora(3, 6.0, nnx.Rngs(1))
        lin.lora_b.value = jax.random.normal(jax.random.key(2), lin.lora_b.shape)  # B starts at 0
    lin.bias.value = jax.random.normal(jax.random.key(3), lin.bias.shape)
    return lin


@pytest.mark.parametrize("lora", [False, True])
def test_into_heads_equals_the_layer_then_a_transpose(lora):
    lin = _layer(12, 4 * 5, lora)
    x = jax.random.normal(jax.random.key(4), (2, 7, 12))
    got = lin.einsum("btd,dnh->bnth", x, (12, 4, 5), (4, 1, 5))
    want = lin(x).reshape(2, 7, 4, 5).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True])
def test_from_heads_equals_a_transpose_then_the_layer(lora):
    lin = _layer(4 * 5, 9, lora)
    y = jax.random.normal(jax.random.key(5), (2, 4, 7, 5))
    got = lin.einsum("bnth,nhd->btd", y, (4, 5, -1))
    want = lin(y.transpose(0, 2, 1, 3).reshape(2, 7, 20))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lora_specs_split_the_kernel_at_its_input_features():
    assert _lora_specs("btd,dnh->bnth", 1) == ("btd,dr->btr", "btr,rnh->bnth")
    assert _lora_specs("bnth,nhd->btd", 2) == ("bnth,nhr->btr", "btr,rd->btd")
    # a spec that already uses r takes the next free letter
    assert _lora_specs("brd,dnh->bnrh", 1) == ("brd,dz->brz", "brz,znh->bnrh")

