""""auto" attention follows the platform of the mesh a call is compiled for (its devices, or the
abstract mesh's device in context), not jax.devices(): a CPU process compiling for a TPU topology
must trace the Pallas kernel a TPU run would execute, and one compiling for a GPU mesh cuDNN."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AbstractDevice, AbstractMesh

from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.layers.attention import (
    Attention,
    is_cuda_platform,
    is_tpu_platform,
    kernel_for,
    resolve_attention_impl,
    target_device,
)


def _abstract_mesh(platform, device_kind):
    return AbstractMesh((2,), ("data",),
                        abstract_device=AbstractDevice(device_kind=device_kind, num_cores=None,
                                                       platform=platform))


TPU = _abstract_mesh("tpu", "TPU v5")
H100 = _abstract_mesh("gpu", "NVIDIA H100 80GB HBM3")
MI300 = _abstract_mesh("gpu", "AMD Instinct MI300X")


@pytest.mark.parametrize(("mesh", "dtype", "expected"), [
    (TPU, jnp.bfloat16, "pallas"),
    (TPU, jnp.float32, "pallas"),
    (H100, jnp.bfloat16, "cudnn"),
    (H100, jnp.float32, "xla"),      # cuDNN flash attention has no fp32 kernel
    (MI300, jnp.bfloat16, "xla"),    # ROCm: no cuDNN
])
def test_auto_follows_the_mesh_in_context(mesh, dtype, expected):
    q = jnp.zeros((1, 64, 2, 64), dtype)
    with jax.sharding.use_abstract_mesh(mesh):
        assert target_device() is mesh.abstract_device
        assert kernel_for("auto", q, 64) == expected
    # the same call on this CPU process, outside the mesh
    assert target_device().platform == "cpu"
    assert kernel_for("auto", q, 64) == "xla"
    # or the mesh passed in
    assert resolve_attention_impl("auto", dtype, 64, seq_len=64, mesh=mesh) == expected


def test_platform_of_a_concrete_mesh_is_its_devices():
    cpu = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    assert target_device(cpu) == jax.devices()[0]
    assert not is_tpu_platform(mesh=cpu)
    assert not is_cuda_platform(mesh=cpu)
    assert is_tpu_platform(mesh=TPU)
    assert not is_cuda_platform(mesh=TPU)
    assert is_cuda_platform(mesh=H100)
    assert not is_cuda_platform(mesh=MI300)


def test_modules_leave_auto_to_the_call():
    # a module may be built without a mesh (or under another) and traced for a TPU mesh: it
    # keeps "auto" and each call resolves it under the mesh it is traced for (test above); a
    # target given explicitly decides at once
    layer = abstract_module(lambda: Attention(16, 2, 8, rngs=nnx.Rngs(0), attention_impl="auto",
                                             dtype=jnp.bfloat16))
    assert layer.attention_impl == "auto"
    assert resolve_attention_impl("auto", jnp.bfloat16, 64, mesh=TPU) == "pallas"
    assert resolve_attention_impl("auto", jnp.bfloat16, 64, mesh=H100) == "cudnn"
    assert resolve_attention_impl("auto", jnp.bfloat16, 64, mesh=MI300) == "auto"  # by length
