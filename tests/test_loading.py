"""Loading straight into shards, export back to diffusers, and the wfm_jax state format.

Uses a tiny registered toy model (tests/_toy_model.py) so the machinery is tested independently
of any real architecture; SD3-specific checks live in test_converters_cli.py.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file

from converters import jax_state
from converters.table import ConversionError, TRANSFORMS
from tests import _toy_model as toy
from wfm_jax import mesh as wmesh
from wfm_jax.models import loading
from wfm_jax.models.state import flat_arrays, flat_params


def _expected(tensors, dtype=np.float32):
    """jax path -> array, computed from the torch-layout tensors independently of the loader."""
    out = {}
    for rule in toy.build_table(toy.CONFIG):
        out[rule.jax] = TRANSFORMS[rule.transform][0](tensors[rule.hf]).astype(dtype)
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tensors = toy.torch_layout_tensors()
    return tensors, toy.write_checkpoint(tmp_path_factory.mktemp("toy"), tensors)


@pytest.fixture(scope="module")
def mesh():
    return wmesh.make_mesh(data=2, fsdp=4)


def test_unsharded_load_matches_checkpoint(ckpt):
    tensors, path = ckpt
    model, config = loading.load_model(path)
    assert config == toy.CONFIG
    got = flat_arrays(model)
    want = _expected(tensors)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # the buffer no rule loads got its constructor value
    np.testing.assert_array_equal(np.asarray(model.freqs[...]), np.arange(8, dtype=np.float32))


def test_sharded_load_places_each_tensor_by_the_rules(ckpt, mesh):
    tensors, path = ckpt
    sharded, _ = loading.load_model(path, mesh=mesh)
    plain, _ = loading.load_model(path)
    want = {"conv.kernel": P(None, None, None, None), "blocks.0.up.kernel": P("fsdp", None),
            "blocks.1.down.kernel": P(None, "fsdp"), "blocks.0.down.bias": P("fsdp"),
            "norm.scale": P("fsdp"), "gain": P()}
    params = flat_params(sharded)
    for k, spec in want.items():
        sharding = params[k][...].sharding
        assert sharding.mesh.shape == mesh.shape, k
        assert sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), params[k].ndim), k
    # every parameter carries exactly the sharding param_shardings derives
    for k, s in wmesh.param_shardings(sharded, mesh).items():
        assert params[k][...].sharding == s, k
    # fsdp really splits: each device holds a quarter of an "embed"-sharded kernel
    kernel = params["blocks.0.up.kernel"][...]
    assert kernel.addressable_shards[0].data.shape == (4, 32)
    host = flat_arrays(sharded)
    for k, v in flat_arrays(plain).items():
        np.testing.assert_array_equal(host[k], v, err_msg=k)
    x = jnp.ones((2, 16))
    forward = nnx.jit(lambda m, x: m(x))
    np.testing.assert_allclose(np.asarray(forward(sharded, x)), np.asarray(forward(plain, x)),
                               atol=1e-6)


def test_bf16_checkpoint_is_cast_to_param_dtype(tmp_path):
    tensors = toy.torch_layout_tensors(seed=1, dtype=toy.BF16)
    path = toy.write_checkpoint(tmp_path / "bf16", tensors)
    model, _ = loading.load_model(path, param_dtype=jnp.float32)
    got = flat_arrays(model)
    for k, v in _expected(tensors).items():
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    model16, _ = loading.load_model(path, param_dtype=jnp.bfloat16)
    assert all(v.dtype == toy.BF16 for v in flat_arrays(model16).values())


def _bad(tmp_path, edit):
    tensors = toy.torch_layout_tensors()
    edit(tensors)
    return toy.write_checkpoint(tmp_path / "bad", tensors)


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.pop("blocks.1.ff.net.2.bias"), "missing keys: blocks.1.ff.net.2.bias"),
    (lambda t: t.update({"blocks.9.extra": np.zeros(2, np.float32)}),
     "unexpected keys: blocks.9.extra"),
    (lambda t: t.update({"blocks.0.ff.net.0.weight": np.zeros((32, 15), np.float32)}),
     "blocks.0.ff.net.0.weight"),
])
def test_bad_checkpoint_names_the_key_before_reading_any_tensor(tmp_path, monkeypatch, edit,
                                                               needle):
    path = _bad(tmp_path, edit)

    def no_reads(_):
        raise AssertionError("a tensor was read before the checks")

    monkeypatch.setattr(loading, "open_checkpoint", no_reads)
    with pytest.raises(ConversionError, match=needle.replace(".", r"\.")):
        loading.load_model(path)


def test_pipeline_dir_uses_its_transformer(tmp_path, ckpt):
    tensors, _ = ckpt
    toy.write_checkpoint(tmp_path / "pipe" / "transformer", tensors)
    with open(tmp_path / "pipe" / "model_index.json", "w") as f:
        json.dump({"_class_name": "ToyPipeline", "transformer": ["diffusers", toy.CLASS]}, f)
    model = __import__("wfm_jax.models", fromlist=["load_transformer"]).load_transformer(
        str(tmp_path / "pipe"))
    np.testing.assert_array_equal(flat_arrays(model)["gain"], tensors["gain"])
    with open(tmp_path / "pipe" / "model_index.json", "w") as f:
        json.dump({"_class_name": "OtherPipeline", "unet": ["diffusers", "UNet"]}, f)
    with pytest.raises(ValueError, match="OtherPipeline"):
        loading.load_model(str(tmp_path / "pipe"))


def test_unsupported_class_and_missing_dir(tmp_path):
    toy.write_checkpoint(tmp_path / "unet", {"w": np.zeros(1, np.float32)},
                         config={"_class_name": "UNet2DConditionModel"})
    with pytest.raises(ValueError, match="UNet2DConditionModel"):
        loading.load_model(str(tmp_path / "unet"))
    with pytest.raises(FileNotFoundError, match="nope"):
        loading.load_model(str(tmp_path / "nope"))


def test_export_round_trip_is_bit_identical_and_atomic(tmp_path, ckpt, mesh):
    tensors, path = ckpt
    model, config = loading.load_model(path, mesh=mesh)
    dst = tmp_path / "export"
    loading.export_diffusers(model, config, str(dst))
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no temporary left behind
    out = load_file(str(dst / "diffusion_pytorch_model.safetensors"))
    assert set(out) == set(tensors)
    for k in tensors:
        assert out[k].dtype == tensors[k].dtype and out[k].tobytes() == tensors[k].tobytes(), k
    assert json.load(open(dst / "config.json")) == toy.CONFIG
    # bf16 export casts; a failing export leaves the previous directory untouched
    loading.export_diffusers(model, config, str(tmp_path / "b16"), dtype=jnp.bfloat16)
    assert all(v.dtype == toy.BF16 for v in load_file(
        str(tmp_path / "b16" / "diffusion_pytorch_model.safetensors")).values())
    with pytest.raises(ValueError, match="unsupported"):
        loading.export_diffusers(model, {"_class_name": "Nope"}, str(dst))
    assert load_file(str(dst / "diffusion_pytorch_model.safetensors")).keys() == out.keys()
    assert sorted(os.listdir(tmp_path)) == ["b16", "export"]


def test_state_save_restore_keeps_dtypes_and_loads_into_shards(tmp_path, mesh):
    flat = {"a.0.w": np.arange(12, dtype=np.float32).reshape(3, 4),
            "a.1.w": np.ones((8,), toy.BF16), "b": np.array([1, 2], np.int32)}
    jax_state.save_state(flat, {"_class_name": "X"}, str(tmp_path / "s"))
    assert jax_state.is_state_dir(str(tmp_path / "s"))
    assert jax_state.read_config(str(tmp_path / "s")) == {"_class_name": "X"}
    back = jax_state.restore_state(str(tmp_path / "s"))
    for k, v in flat.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes(), k
    only = jax_state.restore_state(str(tmp_path / "s"), keys=["a.1.w"])
    assert list(only) == ["a.1.w"]
    # a state dir loads like a diffusers dir, straight into shards
    tensors = toy.torch_layout_tensors(seed=3)
    model, config = loading.load_model(toy.write_checkpoint(tmp_path / "d", tensors))
    jax_state.save_state(flat_arrays(model), config, str(tmp_path / "toy_state"))
    again, _ = loading.load_model(str(tmp_path / "toy_state"), mesh=mesh)
    assert flat_params(again)["blocks.0.up.kernel"][...].sharding.spec == P("fsdp", None)
    host = flat_arrays(again)
    for k, v in flat_arrays(model).items():
        np.testing.assert_array_equal(host[k], v, err_msg=k)
    # sharded jax arrays save as they are and read back on the host
    jax_state.save_state({k: v[...] for k, v in flat_params(again).items()}, config,
                         str(tmp_path / "sharded_state"))
    back = jax_state.restore_state(str(tmp_path / "sharded_state"))
    for k, v in host.items():
        assert isinstance(back[k], np.ndarray) and back[k].tobytes() == v.tobytes(), k


# ----------------------------------------------------------------------------- SD3, sharded

def test_sd3_sharded_forward_equals_single_device_and_diffusers(tmp_path):
    """load_transformer on a (data=2, fsdp=2, context=2) mesh: every parameter carries the rule
    sharding, and the forward equals the single-device one (and diffusers torch)."""
    import torch

    from tests import _tiny_sd3 as sd3
    from wfm_jax.models import load_transformer

    torch_model = sd3.torch_model(seed=5)
    pipe = sd3.as_pipeline(sd3.save(torch_model, tmp_path / "sd3"), tmp_path / "pipe")
    inputs = sd3.inputs()
    with torch.no_grad():
        want = torch_model(*(torch.from_numpy(a) for a in inputs), return_dict=False)[0].numpy()

    mesh = wmesh.make_mesh(data=2, fsdp=2, context=2)
    wmesh.check_batch(mesh, inputs[0].shape[0])
    single = load_transformer(pipe)
    sharded = load_transformer(pipe, mesh=mesh)

    rules = wmesh.param_shardings(sharded, mesh)
    params = flat_params(sharded)
    assert set(rules) == set(params)
    for key, sharding in rules.items():
        assert params[key][...].sharding == sharding, key
    split = [k for k, s in rules.items() if "fsdp" in jax.tree.leaves(tuple(s.spec))]
    assert len(split) > len(rules) // 3  # the "embed" axis really is split over fsdp
    assert all(params[k][...].addressable_shards[0].data.size * 2 == params[k].size for k in split)

    def jit_forward(model):
        graph, state = nnx.split(model)
        return lambda *a: jax.jit(lambda s, *a: nnx.merge(graph, s)(*a))(state, *a)

    one = np.asarray(jit_forward(single)(*inputs))
    with jax.set_mesh(mesh):
        many = jit_forward(sharded)(*inputs)
    assert len(many.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(many), one, atol=1e-5, rtol=0)
    np.testing.assert_allclose(one, want, atol=2e-5, rtol=0)
