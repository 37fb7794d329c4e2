"""Mesh construction, divisibility checks, logical-axis rules and parameter shardings."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from tests import _toy_model as toy
from wfm_jax.core import mesh as wmesh
from wfm_jax.models.layers.linear import param


def test_eight_devices():
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


@pytest.mark.parametrize("sizes, shape", [
    ({}, (8, 1, 1)),
    ({"data": 2, "fsdp": 2, "context": 2}, (2, 2, 2)),
    ({"data": 2, "fsdp": -1}, (2, 4, 1)),
    ({"data": 1, "fsdp": 2, "context": -1}, (1, 2, 4)),
    ({"data": -1, "fsdp": 4}, (2, 4, 1)),
])
def test_make_mesh_fills_minus_one(sizes, shape):
    mesh = wmesh.make_mesh(sizes)
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_names == ("data", "fsdp", "context")
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_accepts_config_objects():
    cfg = ml_collections.ConfigDict({"data": 2, "fsdp": 2, "context": 2})
    assert tuple(wmesh.make_mesh(cfg).shape.values()) == (2, 2, 2)
    assert tuple(wmesh.make_mesh(wmesh.MeshConfig(fsdp=8, data=1)).shape.values()) == (1, 8, 1)
    assert tuple(wmesh.make_mesh(fsdp=2, data=-1).shape.values()) == (4, 2, 1)
    devices = jax.devices()[:4]
    assert wmesh.make_mesh(data=-1, devices=devices).devices.size == 4


def test_make_mesh_splits_physical_axes_a_torus_cannot_hold_whole():
    # v5p 4x4x4: context 8 is no product of the 4-long physical axes; jax.make_mesh refuses it
    # (NotImplementedError), the mesh splits a physical axis instead (compile-only devices)
    pytest.importorskip("libtpu")
    from jax.experimental import topologies
    devices = topologies.get_topology_desc("v5p:4x4x4", platform="tpu").devices
    with pytest.raises(NotImplementedError):
        jax.make_mesh((1, 8, 8), ("data", "fsdp", "context"), devices=devices)
    mesh = wmesh.make_mesh(data=1, fsdp=8, context=8, devices=devices)
    assert tuple(mesh.shape.values()) == (1, 8, 8)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
    assert all(t == AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize("sizes, words", [
    ({"data": 2, "fsdp": 2, "context": 3}, ["needs 12 devices", "8 are available"]),
    ({"data": 3}, ["needs 3 devices", "8 are available"]),
    ({"data": -1, "fsdp": 3}, ["data=-1", "3 devices", "8 devices"]),
    ({"data": -1, "fsdp": -1}, ["only one mesh axis may be -1"]),
    ({"data": 0}, ["positive or -1"]),
    ({"tensor": 2}, ["unknown mesh axes ['tensor']"]),
])
def test_make_mesh_errors_name_the_numbers(sizes, words):
    with pytest.raises(ValueError) as err:
        wmesh.make_mesh(sizes)
    for w in words:
        assert w in str(err.value)


def test_config_parallelism_builds_the_mesh_with_any_axis_filled():
    from wfm_jax.config.schema import default_config
    from wfm_jax.train.setup import SetupError, build_mesh
    config = default_config()
    p = config.policy.parallelism
    p.data, p.fsdp, p.context = 1, -1, 1
    assert dict(build_mesh(config).shape) == {"data": 1, "fsdp": 8, "context": 1}
    p.data, p.fsdp, p.context = 2, 2, -1
    assert dict(build_mesh(config).shape) == {"data": 2, "fsdp": 2, "context": 2}
    p.data, p.fsdp, p.context = 3, -1, 1
    with pytest.raises(SetupError) as err:
        build_mesh(config)
    msg = str(err.value)
    assert msg.startswith("policy.parallelism: cannot fill fsdp=-1") and "\n" not in msg
    assert "3 devices" in msg and "8 devices" in msg


def test_divisibility_checks():
    mesh = wmesh.make_mesh(data=2, fsdp=2, context=2)
    wmesh.check_batch(mesh, 8)
    wmesh.check_sequence(mesh, 6)
    wmesh.check_heads(mesh, 3)  # heads replicated by default
    with pytest.raises(ValueError,
                       match=r"global batch size 6 is not divisible by 4 .*data=2 x fsdp=2"):
        wmesh.check_batch(mesh, 6)
    with pytest.raises(ValueError, match=r"sequence length 7 is not divisible by 2 .*context=2"):
        wmesh.check_sequence(mesh, 7)
    rules = dict(wmesh.DEFAULT_RULES) | {"act_heads": "context"}
    with pytest.raises(ValueError, match=r"number of attention heads 3 is not divisible by 2"):
        wmesh.check_heads(mesh, 3, tuple(rules.items()))
    with wmesh.use_rules(tuple(rules.items())):
        with pytest.raises(ValueError, match="attention heads 5"):
            wmesh.check_heads(mesh, 5)
    wmesh.check_heads(mesh, 5)  # back to the defaults outside the block


@pytest.fixture(scope="module")
def abstract_toy():
    return nnx.eval_shape(lambda: toy.make_model(toy.CONFIG, rngs=nnx.Rngs(0)))


def test_param_shardings_follow_default_and_overridden_rules(abstract_toy):
    mesh = wmesh.make_mesh(data=2, fsdp=4)
    specs = {k: s.spec for k, s in wmesh.param_shardings(abstract_toy, mesh).items()}
    assert specs["blocks.0.up.kernel"] == P("fsdp", None)
    assert specs["blocks.0.down.kernel"] == P(None, "fsdp")
    assert specs["blocks.0.up.bias"] == P(None)
    assert specs["norm.scale"] == P("fsdp")
    assert specs["gain"] == P()
    assert "freqs" not in specs  # only Params by default
    rules = wmesh.rules_with({"embed": None, "mlp": "fsdp", "conv_out": "data"})
    specs = {k: s.spec for k, s in wmesh.param_shardings(abstract_toy, mesh, rules).items()}
    assert specs["blocks.0.up.kernel"] == P(None, "fsdp")
    assert specs["blocks.1.up.bias"] == P("fsdp")
    assert specs["conv.kernel"] == P(None, None, None, "data")
    everything = wmesh.param_shardings(abstract_toy, mesh, filter=nnx.Variable)
    assert everything["freqs"].spec == P()


def test_param_shardings_errors_name_the_parameter():
    class Bad(nnx.Module):
        def __init__(self, shape, axes):
            self.w = param(jnp.zeros(shape), axes)

    mesh = wmesh.make_mesh(data=2, fsdp=4)
    with pytest.raises(ValueError,
                       match=r"w: dimension 6 .* not divisible by mesh axes \('fsdp',\) = 4"):
        wmesh.param_shardings(nnx.eval_shape(lambda: Bad((6,), ("embed",))), mesh)
    with pytest.raises(ValueError, match=r"w: logical axes \('tensor',\) map to \['tensor'\]"):
        wmesh.param_shardings(nnx.eval_shape(lambda: Bad((8,), ("tensor",))), mesh)
    with pytest.raises(ValueError, match=r"w: logical axes \('tensor',\) map to \['tensor'\]"):
        wmesh.param_shardings(nnx.eval_shape(lambda: Bad((8,), ("tensor",))), mesh,
                              (("embed", "fsdp"),))  # a name the rules do not cover
    with pytest.raises(ValueError, match="use a mesh axis twice"):
        wmesh.param_shardings(nnx.eval_shape(lambda: Bad((8, 8), ("embed", "embed"))), mesh)


def test_constrain_uses_active_rules_under_set_mesh():
    mesh = wmesh.make_mesh(data=2, fsdp=2, context=2)
    x = jnp.zeros((8, 4, 6))
    axes = ("act_batch", "act_seq", "act_embed")

    @jax.jit
    def f(x):
        return wmesh.constrain(x * 2, axes)

    assert wmesh.constrain(x, axes) is x  # no mesh: no-op
    def spec_of(y):
        return tuple(y.sharding.spec) + (None,) * (y.ndim - len(y.sharding.spec))

    with jax.set_mesh(mesh):
        assert spec_of(f(x)) == (("data", "fsdp"), "context", None)
        with wmesh.use_rules((("act_batch", "data"), ("act_seq", None), ("act_embed", "fsdp"))):
            f2 = jax.jit(lambda x: wmesh.constrain(x + 1, axes))
            assert spec_of(f2(jnp.zeros((8, 4, 8)))) == ("data", None, "fsdp")
        with pytest.raises(ValueError, match=r"logical axes \['act_time'\] have no rule"):
            jax.jit(lambda x: wmesh.constrain(x, ("act_time", None, None)))(x)


def test_distributed_single_process_does_nothing(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(var, raising=False)
    called = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: called.append(kw))
    assert wmesh.maybe_initialize_distributed() is False
    assert wmesh.maybe_initialize_distributed("host:1234", 1, 0) is False
    with pytest.raises(ValueError, match="coordinator address"):
        wmesh.maybe_initialize_distributed(num_processes=4, process_id=0)
    with pytest.raises(ValueError, match=r"process_id 4 is outside \[0, 4\)"):
        wmesh.maybe_initialize_distributed("host:1234", 4, 4)
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert wmesh.maybe_initialize_distributed() is True
    assert called == [{"coordinator_address": "host:1234", "num_processes": 2, "process_id": 1}]
