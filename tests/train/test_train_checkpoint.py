"""Checkpointer: bit-identical round trip, pruning, atomicity, sharded restore, bad input."""
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.programs.optim import make_optimizer
from wfm_jax.programs.state import TrainState, train_state_update
from wfm_jax.train.checkpoint import Checkpointer, CheckpointError, abstract_of


def _leaves_bytes(tree):
    out = []
    for x in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        a = np.asarray(jax.device_get(x))
        out.append((a.dtype.str, a.shape, a.tobytes()))
    return out


def _train_state(seed=0, steps=3):
    """A TrainState that went through real updates (non-trivial Adam moments, accumulation
    buffers, EMA), with a bf16 leaf, a typed key and an aux copy (the RL "old" policy)."""
    r = np.random.default_rng(seed)
    params = {"w": jnp.asarray(r.standard_normal((4, 8)), jnp.float32),
              "scale": jnp.asarray(r.standard_normal((8,)), jnp.bfloat16)}
    tx = make_optimizer(1e-2, weight_decay=0.1, grad_norm_clip=1.0, grad_accum_steps=2)
    state = TrainState.create(params, tx, jax.random.key(seed), ema=True,
                              aux={"old": jax.tree.map(jnp.copy, params)})
    update = jax.jit(lambda s, g: train_state_update(s, g, tx, ema_decay=0.9, ema_interval=1)[0])
    for _ in range(steps):
        grads = jax.tree.map(lambda x: jnp.asarray(r.standard_normal(x.shape), x.dtype), params)
        state = update(state, grads)
    return state.replace(rng=jax.random.split(state.rng)[0])


def test_round_trip_bit_identical(tmp_path):
    state = _train_state()
    want = _leaves_bytes(state)
    abstract = abstract_of(state)
    ck = Checkpointer(tmp_path / "ckpt", max_keep=3, save_freq=1)
    assert ck.restore_latest(abstract) is None
    extra = {"lr": 0.01, "epoch": 2, "note": "x"}
    data = {"next_index": 17, "shard": [0, 2]}
    assert ck.save(3, state, extra=extra, data_state=data)
    # async save copied the arrays off the devices: the loop may donate them right away
    for x in jax.tree.leaves(state):
        x.delete()
    ck.close()

    ck = Checkpointer(tmp_path / "ckpt", max_keep=3, save_freq=1)
    restored = ck.restore_latest(abstract)
    assert restored.step == 3 and restored.extra == extra and restored.data_state == data
    assert _leaves_bytes(restored.state) == want
    assert restored.state.params["scale"].dtype == jnp.bfloat16
    assert restored.state.rng.dtype == abstract.rng.dtype
    assert jax.tree.structure(restored.state) == jax.tree.structure(abstract)
    ck.close()


def test_max_keep_save_freq_and_existing_step(tmp_path):
    state = {"x": jnp.arange(3.0)}
    with Checkpointer(tmp_path, max_keep=2, save_freq=2) as ck:
        assert [ck.save(s, state) for s in range(1, 7)] == [False, True, False, True, False, True]
        ck.wait()
        assert ck.all_steps() == [4, 6]
        assert ck.save(7, state, force=True)
        ck.wait()
        assert ck.all_steps() == [6, 7]
        with pytest.raises(CheckpointError, match="step 7 already exists"):
            ck.save(7, state, force=True)
        with pytest.raises(CheckpointError, match="not JSON"):
            ck.save(8, state, extra={"bad": object()}, force=True)
    with Checkpointer(tmp_path / "off", save_freq=0) as ck:   # 0 = only forced saves
        assert not ck.save(10, state)


def test_interrupted_save_is_never_latest(tmp_path):
    state = {"x": jnp.arange(4.0)}
    with Checkpointer(tmp_path, save_freq=1) as ck:
        ck.save(2, state)
    # what a save killed mid-write leaves behind: orbax's temporary step directory
    shutil.copytree(tmp_path / "2", tmp_path / "5.orbax-checkpoint-tmp-1700000000")
    with Checkpointer(tmp_path, save_freq=1) as ck:
        assert ck.latest_step() == 2 and ck.all_steps() == [2]
        restored = ck.restore_latest(abstract_of(state))
        assert restored.step == 2
        ck.save(3, {"x": jnp.arange(4.0) + 1})
        ck.wait()
        assert not (tmp_path / "5.orbax-checkpoint-tmp-1700000000").exists()
        assert ck.all_steps() == [2, 3]


def test_restore_into_requested_shardings(tmp_path):
    if jax.device_count() < 2:
        pytest.skip("needs several devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    n = jax.device_count()
    mesh = jax.make_mesh((2, n // 2), ("data", "fsdp"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)

    class Tiny(nnx.Module):   # an NNX state (Param + LoRAParam) as the checkpointed tree
        def __init__(self, rngs):
            self.kernel = nnx.Param(jax.random.normal(rngs.params(), (n, 2 * n)))
            self.lora_a = nnx.LoRAParam(jax.random.normal(rngs.params(), (2 * n, 4)))

    params = nnx.state(Tiny(nnx.Rngs(0)))
    state = {"params": params, "rng": jax.random.key(7), "step": jnp.int32(9)}
    with Checkpointer(tmp_path, save_freq=1) as ck:
        ck.save(9, state)
    want = _leaves_bytes(state)

    specs = {"params": jax.tree.map(lambda x: P("fsdp", None) if x.ndim == 2 else P(), params),
             "rng": P(), "step": P()}
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, P))
    abstract = jax.eval_shape(lambda: state)
    with Checkpointer(tmp_path, save_freq=1) as ck:
        restored = ck.restore_latest(abstract, shardings)
    assert _leaves_bytes(restored.state) == want
    got = jax.tree.leaves(restored.state)
    for x, s in zip(got, jax.tree.leaves(shardings)):
        assert x.sharding == s
    assert restored.state["params"]["kernel"][...].sharding.spec == P("fsdp", None)
    assert len(restored.state["params"]["kernel"][...].addressable_shards) == n


def test_mismatched_state_names_the_checkpoint(tmp_path):
    with Checkpointer(tmp_path, save_freq=1) as ck:
        ck.save(1, {"x": jnp.zeros((3,))})
    with Checkpointer(tmp_path, save_freq=1) as ck:
        with pytest.raises(CheckpointError, match=os.path.join(str(tmp_path), "1")):
            ck.restore_latest({"x": jax.ShapeDtypeStruct((5,), jnp.float32)})
        with pytest.raises(CheckpointError, match="no finalized checkpoint step 4"):
            ck.restore(4, {"x": jax.ShapeDtypeStruct((3,), jnp.float32)})


def test_mismatch_is_one_line_naming_the_leaves(tmp_path):
    # a full fine-tune's checkpoint resumed with LoRA on: many leaves missing, many extra, one
    # reshaped; orbax's own message dumped the whole tree and suggested partial_restore=True
    blocks = {f"block{i}": {"kernel": jnp.zeros((4, 4)), "bias": jnp.zeros((4,))}
              for i in range(40)}
    with Checkpointer(tmp_path, save_freq=1, async_=False) as ck:
        ck.save(1, {"params": blocks, "step": jnp.zeros((), jnp.int32)})
    want = {f"block{i}": {"lora_a": jax.ShapeDtypeStruct((4, 2), jnp.float32),
                          "bias": jax.ShapeDtypeStruct((4,), jnp.float32)} for i in range(40)}
    want["block0"]["bias"] = jax.ShapeDtypeStruct((8,), jnp.float32)
    with Checkpointer(tmp_path, save_freq=1) as ck:
        with pytest.raises(CheckpointError) as info:
            ck.restore_latest({"params": want, "step": jax.ShapeDtypeStruct((), jnp.int32)})
    message = str(info.value)
    assert "\n" not in message and len(message) < 600, message
    assert "partial_restore" not in message
    assert "40 leaves this run needs are not in it (params.block0.lora_a, " in message
    assert "40 saved leaves this run does not have (params.block0.kernel, " in message
    assert "params.block0.bias: saved (4,), this run (8,)" in message


def test_saves_and_removals_are_said(tmp_path, capsys):
    with Checkpointer(tmp_path, max_keep=2, save_freq=1, async_=False) as ck:
        for step in (1, 2, 3, 4):
            ck.save(step, {"x": jnp.full((2,), step)})
        assert ck.all_steps() == [3, 4]
    lines = capsys.readouterr().out.splitlines()
    d = os.path.abspath(tmp_path)
    assert lines == [f"checkpoint step 1 saved in {d}/1", f"checkpoint step 2 saved in {d}/2",
                     f"checkpoint step 3 saved in {d}/3; removing step 1 (train.ckpt.max_keep=2)",
                     f"checkpoint step 4 saved in {d}/4; removing step 2 (train.ckpt.max_keep=2)"]
