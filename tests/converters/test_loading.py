"""Loading straight into shards, export back to diffusers, and the wfm_jax state format.

Uses a tiny registered toy model (tests/_toy_model.py) so the machinery is tested independently
of any real architecture; SD3-specific checks live in test_converters_cli.py.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file

from converters import jax_state, loading
from converters.safetensors_io import open_checkpoint_slices
from converters.table import TRANSFORMS, ConversionError, Rule
from tests import _toy_model as toy
from tests._support.paths import REPO_ROOT
from tests._support.xla import host_devices
from tests._two_process_load import bounds, recording_opener
from wfm_jax.core import mesh as wmesh
from wfm_jax.core.tree import flat_arrays, flat_params


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


# ----------------------------------------------------------------------------- slice reads

# stored-layout bounds of a shard, written out per transform (independent of the loader's
# permutation probe): linear kernels (in, out) are stored (out, in); conv HWIO is stored OIHW
STORED_ORDER = {"identity": lambda b: b, "linear": lambda b: b[::-1],
                "conv": lambda b: (b[3], b[2], b[0], b[1])}


def _expected_reads(rule, sharding, shape, devices=None) -> set:
    """Stored-layout (start, stop) bounds of each distinct shard that `devices` hold."""
    out = set()
    for device, index in sharding.devices_indices_map(shape).items():
        if devices is None or device in devices:
            out.add(STORED_ORDER[rule.transform](
                tuple(s.indices(n)[:2] for s, n in zip(index, shape))))
    return out


def test_sharded_load_reads_each_distinct_shard_once(ckpt, mesh, monkeypatch):
    """On a (data=2, fsdp=4) mesh an fsdp-sharded tensor is read as 4 quarter slices (the data
    replicas share them) and a replicated one once, never once per device; values are exact."""
    tensors, path = ckpt
    reads = []
    monkeypatch.setattr(loading, "open_checkpoint_slices",
                        recording_opener(loading.open_checkpoint_slices, reads))
    model, _ = loading.load_model(path, mesh=mesh)
    want = _expected(tensors)
    got = flat_arrays(model)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    shardings = wmesh.param_shardings(model, mesh)
    by_key = {}
    for key, read_bounds, size in reads:
        by_key.setdefault(key, []).append((read_bounds, size))
    for rule in toy.build_table(toy.CONFIG):
        shape = want[rule.jax].shape
        got_reads = by_key.pop(rule.hf)
        expected = _expected_reads(rule, shardings[rule.jax], shape)
        assert Counter(b for b, _ in got_reads) == Counter(expected), rule.hf  # each slice once
        assert sum(n for _, n in got_reads) == math.prod(shape), rule.hf  # one process: all, once
    assert not by_key  # nothing read outside the table
    fsdp = [b for k, b, _ in reads if k == "blocks.0.ff.net.0.weight"]
    assert sorted(fsdp) == [((0, 32), (4 * i, 4 * i + 4)) for i in range(4)]  # stored (out, in)
    assert [n for k, _, n in reads if k == "conv_in.weight"] == [tensors["conv_in.weight"].size]


@pytest.mark.parametrize("jax_path, spec", [
    ("blocks.0.up.kernel", P("fsdp", None)),  # stored (out, in): a column block per device
    ("blocks.1.down.kernel", P(None, "fsdp")),  # stored (out, in): a row block per device
    ("conv.kernel", P(None, None, None, "fsdp")),  # HWIO split on O: stored OIHW rows
    ("conv.kernel", P(None, None, "data", "fsdp")),  # split on I and O
])
def test_half_the_devices_read_only_their_slices(ckpt, jax_path, spec):
    """Process 0 of two (devices 0..3 of an 8-device mesh) plans and reads exactly its shards'
    slices in the stored layout: half of the tensor, each slice once."""
    tensors, path = ckpt
    rule = next(r for r in toy.build_table(toy.CONFIG) if r.jax == jax_path)
    want = _expected(tensors)[jax_path]
    mesh = wmesh.make_mesh(data=2, fsdp=4) if "data" in spec else wmesh.make_mesh(fsdp=8)
    first_half = set(jax.devices()[:4])
    sharding = NamedSharding(mesh, spec)
    mine = {d: i for d, i in sharding.devices_indices_map(want.shape).items() if d in first_half}
    plan = loading.plan_reads(loading.axis_permutation(rule.transform, want.ndim), mine,
                              want.shape)
    assert Counter(bounds(stored) for stored, _, _ in plan) == Counter(
        _expected_reads(rule, sharding, want.shape, first_half))
    assert sorted(d.id for _, _, devices in plan for d in devices) == [0, 1, 2, 3]
    elements = 0
    with open_checkpoint_slices(path) as readers:
        for stored, index, _ in plan:
            piece = TRANSFORMS[rule.transform][0](readers[rule.hf](stored))
            np.testing.assert_array_equal(piece, want[index])
            elements += piece.size
    assert elements * 2 == want.size


def test_a_transform_that_is_not_a_permutation_is_read_whole_once(monkeypatch, mesh):
    """Slices of a flipped tensor are not slices of the stored one: the loader reads it whole
    (once per process) and cuts the shards from the transformed tensor."""
    assert loading.axis_permutation("linear", 2) == (1, 0)
    assert loading.axis_permutation("conv", 4) == (2, 3, 1, 0)  # HWIO from OIHW
    monkeypatch.setitem(TRANSFORMS, "flip", (lambda w: np.flip(w, 0), lambda w: np.flip(w, 0)))
    loading.axis_permutation.cache_clear()
    assert loading.axis_permutation("flip", 2) is None
    stored = np.arange(32, dtype=np.float32).reshape(8, 4)
    reads = []
    sharding = NamedSharding(mesh, P("fsdp", None))
    out = loading.load_tensor(lambda index: reads.append(index) or stored,
                              Rule("x", "x.weight", "flip"), (8, 4), np.float32, sharding)
    assert reads == [()]
    assert out.sharding == sharding
    np.testing.assert_array_equal(np.asarray(out), np.flip(stored, 0))


def test_an_error_in_one_process_s_tied_slices_stops_every_process(monkeypatch):
    """Each process checks only the slices of a tied pair it reads: the others must stop too
    instead of waiting at their next collective."""
    from jax.experimental import multihost_utils
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda flag: np.array([0, 1]))
    with pytest.raises(ConversionError, match=r"process\(es\) \[1\] stopped loading the tied"):
        loading.agree_on_failure(None)
    own = ConversionError("tied keys shared.weight and encoder.embed_tokens.weight differ")
    with pytest.raises(ConversionError, match="tied keys shared.weight"):
        loading.agree_on_failure(own)  # the process that found it raises its own error
    gathered = []
    monkeypatch.setattr(multihost_utils, "process_allgather",
                        lambda flag: gathered.append(int(flag)) or np.array([0, 0]))
    loading.agree_on_failure(None)  # nobody failed: loading goes on
    assert gathered == [0]


def test_bf16_slices_read_without_jax_imported(tmp_path):
    """safetensors' numpy reader needs ml_dtypes' "bfloat16"; jax usually registers it, but the
    converters must not rely on jax having been imported first."""
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4).astype(toy.BF16)}
    path = toy.write_checkpoint(tmp_path, tensors)
    code = ("import sys; from converters.safetensors_io import open_checkpoint_slices as o\n"
            f"with o({path!r}) as r: x = r['w']((slice(1, 3), slice(0, 2)))\n"
            "assert 'jax' not in sys.modules; print(x.dtype, x.tobytes().hex())")
    root = REPO_ROOT
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["bfloat16", tensors["w"][1:3, 0:2].tobytes().hex()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_each_read_their_half(ckpt, tmp_path):
    """Two real CPU processes (jax.distributed, 4 devices each) on an fsdp=8 mesh: every shard
    holds the checkpoint's values, each process reads half of every fsdp-split tensor, and the
    two halves are disjoint and cover it."""
    tensors, path = ckpt
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS=host_devices(4),
               JAX_PLATFORMS="cpu")
    root = REPO_ROOT
    procs = [subprocess.Popen([sys.executable, "-m", "tests._two_process_load", str(i),
                               str(port), path, str(tmp_path / f"{i}.json")], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    results = [json.load(open(tmp_path / f"{i}.json")) for i in range(2)]
    assert [len(r["devices"]) for r in results] == [4, 4]
    assert not set(results[0]["devices"]) & set(results[1]["devices"])
    reads = []
    for r in results:
        assert r["wrong"] == []
        per_key = {}
        for key, read_bounds, size in r["reads"]:
            per_key.setdefault(key, []).append((tuple(map(tuple, read_bounds)), size))
        reads.append(per_key)
    shardings = wmesh.param_shardings(loading.abstract_model(toy.SPEC, toy.CONFIG),
                                      wmesh.make_mesh(fsdp=8))
    split = {r.hf for r in toy.build_table(toy.CONFIG)
             if "fsdp" in jax.tree.leaves(tuple(shardings[r.jax].spec))}
    assert len(split) >= 5
    for key, tensor in tensors.items():
        first, second = ([b for b, _ in r[key]] for r in reads)
        sizes = [sum(n for _, n in r[key]) for r in reads]
        if key in split:  # half each, disjoint
            assert sizes == [tensor.size // 2] * 2 and not set(first) & set(second), key
        else:  # replicated: whole, once per process
            assert sizes == [tensor.size] * 2 and len(first) == len(second) == 1, key


def test_bf16_checkpoint_is_cast_to_param_dtype(tmp_path, mesh):
    tensors = toy.torch_layout_tensors(seed=1, dtype=toy.BF16)
    path = toy.write_checkpoint(tmp_path / "bf16", tensors)
    model, _ = loading.load_model(path, param_dtype=jnp.float32)
    got = flat_arrays(model)
    for k, v in _expected(tensors).items():
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    # bf16 slices (safetensors get_slice + ml_dtypes) land in shards bit for bit
    model16, _ = loading.load_model(path, param_dtype=jnp.bfloat16, mesh=mesh)
    got16 = flat_arrays(model16)
    for k, v in _expected(tensors, toy.BF16).items():
        assert got16[k].dtype == toy.BF16 and got16[k].tobytes() == v.tobytes(), k


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

    monkeypatch.setattr(loading, "open_checkpoint_slices", no_reads)
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
            "a.1.w": np.ones((8,), toy.BF16), "b": np.array([1, 2], np.int32),
            "big": np.zeros((1024, 2048), np.float32)}  # twice the default chunk bound
    jax_state.save_state(flat, {"_class_name": "X"}, str(tmp_path / "s"))
    assert jax_state.is_state_dir(str(tmp_path / "s"))
    chunks = jax_state.chunk_shapes(str(tmp_path / "s"))
    assert chunks["a.0.w"] == (3, 4)  # small arrays stay one chunk
    assert math.prod(chunks["big"]) * 4 <= jax_state.CHUNK_BYTES < flat["big"].nbytes
    assert jax_state.read_config(str(tmp_path / "s")) == {"_class_name": "X"}
    back = jax_state.restore_state(str(tmp_path / "s"))
    for k, v in flat.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes(), k
    only = jax_state.restore_state(str(tmp_path / "s"), keys=["a.1.w"])
    assert list(only) == ["a.1.w"]
    # a state dir loads like a diffusers dir, straight into shards
    tensors = toy.torch_layout_tensors(seed=3)
    model, config = loading.load_model(toy.write_checkpoint(tmp_path / "d", tensors))
    # small chunks: a process restoring its shards reads only the chunks they overlap
    jax_state.save_state(flat_arrays(model), config, str(tmp_path / "toy_state"),
                         chunk_bytes=512)
    assert math.prod(jax_state.chunk_shapes(str(tmp_path / "toy_state"))["blocks.0.up.kernel"]
                     ) * 4 <= 512
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
