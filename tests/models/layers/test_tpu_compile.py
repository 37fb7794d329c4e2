"""Attention compiled by the real TPU compiler for a v5p:2x2x1 topology (4 chips) described in
software, on this CPU-only machine (/work/shared/specs/tpu_aot.md): on that mesh "auto" is the
Pallas flash kernel, and the compiled program holds its Mosaic custom calls (forward, and the
dK/dV and dQ kernels of the backward), inside shard_map over the batch or, with the sequence
split over `context`, after Ulysses' all-to-all.

Needs libtpu (the `tpu` extra: jax[tpu]); skipped without it.
"""
from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding

from tests._support.attention import record_heads_first
from wfm_jax.core import mesh as wmesh
from wfm_jax.models.layers.attention import dot_product_attention, kernel_for

pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed: "
                                     "pip install 'jax[tpu]==0.10.2'")
MOSAIC = 'custom_call_target="tpu_custom_call"'


@pytest.fixture(scope="module")
def topology_devices():
    # no TPU to share: without this, a second process loading libtpu (pytest-xdist) aborts on
    # libtpu's multi-process lockfile
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    return topologies.get_topology_desc("v5p:2x2x1", platform="tpu").devices


@pytest.mark.parametrize(("sizes", "collective"), [
    ({"data": 1, "fsdp": 4}, None),               # sequence unsplit: shard_map over the batch
    ({"data": 2, "context": 2}, "all-to-all"),    # Ulysses: the sequence split moved to heads
])
def test_auto_attention_compiles_to_the_pallas_kernel_for_tpu(topology_devices, sizes,
                                                               collective):
    m = wmesh.make_mesh(devices=topology_devices, **sizes)
    assert len(topology_devices) == 4
    assert topology_devices[0].platform == "tpu"
    spec = NamedSharding(m, wmesh.logical_to_spec(("act_batch", "act_seq", "act_heads", None)))
    x = jax.ShapeDtypeStruct((4, 256, 4, 128), jnp.bfloat16, sharding=spec)

    def loss(q, k, v):
        return jnp.sum(dot_product_attention(q, k, v, implementation="auto").astype(jnp.float32))

    with jax.set_mesh(m):
        assert kernel_for("auto", x, 256) == "pallas"  # jax.devices() here are CPUs
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile()
    hlo = compiled.as_text()
    # flash forward (with residuals) + dK/dV + dQ; no (256 x 256) score tensor
    assert hlo.count(MOSAIC) == 3, hlo.count(MOSAIC)
    assert "256,256]" not in hlo
    if collective:
        assert collective in hlo
    assert compiled.memory_analysis().temp_size_in_bytes > 0


def test_cosmos_attention_in_the_kernels_layout_compiles_for_tpu(topology_devices, monkeypatch):
    """Cosmos' self-attention (RoPE, per-head q/k norms) on "auto" with the sequence unsplit
    (fsdp 4) takes the kernel's (B, N, T, H) layout (layers/attention.py `runs_heads_first`) and
    compiles to the three Mosaic kernels inside shard_map, with no (T x T) score tensor."""
    from flax import nnx

    from wfm_jax.models.cosmos.attention import CosmosAttention
    from wfm_jax.models.cosmos.rope import rope_tables
    m = wmesh.make_mesh(devices=topology_devices, data=1, fsdp=4)
    module = CosmosAttention(256, 2, 128, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, attention_impl="auto")
    graphdef, params = nnx.split(module)
    spec = NamedSharding(m, wmesh.logical_to_spec(("act_batch", "act_seq", "act_embed")))
    x = jax.ShapeDtypeStruct((4, 256, 256), jnp.bfloat16, sharding=spec)
    rope = tuple(jnp.asarray(t) for t in rope_tables(128, (4, 8, 8), 8))
    taken = record_heads_first(monkeypatch)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params)(x, None, rope).astype(jnp.float32))

    with jax.set_mesh(m):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    hlo = compiled.as_text()
    assert taken  # the kernel's layout, not the transposing wrapper
    assert hlo.count(MOSAIC) == 3, hlo.count(MOSAIC)
    assert not re.search(r"\[\d+,\d+,256,256\]", hlo)  # no (B, N, T, T) scores (weights are 256 x 256)
