"""programs.stats.count_jaxpr_flops on Pallas kernels: JAX's TPU flash attention, traced (not
run) on CPU. A kernel counts its body once per grid cell; the flash backward's recomputation of
the scores is left out, so a training step counts attention's model FLOPs as the plain-XLA
attention's jaxpr does: 2 matmul units forward, 4 backward (a unit: 2 x B x N x T x S x H)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from wfm_jax.programs.stats import count_jaxpr_flops

B, N, T, S, H = 1, 2, 256, 384, 64
UNIT = 2 * B * N * T * S * H


def _xla_attention(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bnth,bnsh->bnts", q, k) * 0.125, axis=-1)
    return jnp.einsum("bnts,bnsh->bnth", p, v)


@pytest.fixture(scope="module")
def qkv():
    return (jnp.ones((B, N, T, H), jnp.float32), jnp.ones((B, N, S, H), jnp.float32),
            jnp.ones((B, N, S, H), jnp.float32))


def test_flash_attention_counts_the_model_flops_of_xla_attention(qkv):
    flash = pytest.importorskip("jax.experimental.pallas.ops.tpu.flash_attention")

    def loss(attn):
        return lambda q, k, v: attn(q, k, v).sum()

    kernel = lambda q, k, v: flash.flash_attention(q, k, v, sm_scale=0.125)
    forward = count_jaxpr_flops(jax.make_jaxpr(kernel)(*qkv))
    train = count_jaxpr_flops(jax.make_jaxpr(jax.grad(loss(kernel), argnums=(0, 1, 2)))(*qkv))
    assert forward == 2 * UNIT
    assert train == 6 * UNIT
    # the same count as attention written in XLA ops (its softmax has no matmuls)
    xla = count_jaxpr_flops(jax.make_jaxpr(jax.grad(loss(_xla_attention), argnums=(0, 1, 2)))(*qkv))
    assert train == xla


def test_a_shard_map_body_counts_once_per_shard():
    """A shard_map's body holds one shard's shapes; the count is of the whole program."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((len(jax.devices()),), ("fsdp",))
    x = jax.device_put(jnp.ones((8 * len(jax.devices()), 16)), NamedSharding(mesh, P("fsdp")))
    with jax.set_mesh(mesh):
        split = jax.make_jaxpr(jax.shard_map(lambda a: a @ a.T, mesh=mesh, in_specs=P("fsdp"),
                                             out_specs=P("fsdp")))(x)
    whole = jax.make_jaxpr(lambda a: jnp.einsum("bij,bkj->bik", a, a))(
        x.reshape(len(jax.devices()), 8, 16))
    assert count_jaxpr_flops(split) == count_jaxpr_flops(whole) == 2 * x.shape[0] * 8 * 16
