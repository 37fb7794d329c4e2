"""The training loops do no repeated or serialised work: the RL loop encodes each distinct
prompt once per batch (with the same conditioning bits as one encoding per rollout chunk) and
fetches a chunk's pixels for the rewards only after the next chunk's rollout is dispatched; the
SFT loop fetches a step's metrics only after the next step's data is loaded and its encoders
dispatched, and logs the same values. On the tiny random SD3 pipeline, 8 CPU devices (fsdp);
the RL tests do not run the sampler."""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from tests._support.paths import CONFIGS
from tests._support.xla import host_devices
from wfm_jax.config.recipe import load_config
from wfm_jax.programs.rl_encode import max_local_groups

CONFIGS = CONFIGS


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("overlap") / "pipe"), seed=0)


@pytest.fixture(scope="module")
def run(pipe_dir, tmp_path_factory):
    from tests._rl_toy import PROMPTS
    from wfm_jax.train import rl_setup
    values = {"policy.model_name_or_path": pipe_dir,
              "train.output_dir": str(tmp_path_factory.mktemp("rl_out")),
              "policy.parallelism.data": 1, "policy.parallelism.fsdp": 8,
              "policy.diffusers.inference_size": "(16, 16)", "train.train_batch_per_replica": 16,
              "train.train_policy.mini_batch": 1, "rollout.n_generation": 4,
              "train.train_policy.dataset.local_dir": PROMPTS, "validation.enable": False,
              "train.train_policy.remote_reward.reward_fns":
                  '[{"name": "jpeg_compressibility", "weight": 1.0, "score_key": ""}]'}
    config = load_config(os.path.join(CONFIGS, "tiny_nft.py"),
                         [(k, str(v)) for k, v in values.items()])
    r = rl_setup.build(config)
    yield r
    r.close()


class Spy:
    """Counts run.encode's calls and rows."""

    def __init__(self, run, monkeypatch):
        self.calls, self.rows, encode = 0, 0, run.encode

        def counted(prompts, negative=False):
            self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
            return encode(prompts, negative)
        monkeypatch.setattr(run, "encode", counted)


def test_each_prompt_encoded_once_with_the_same_bits(run, monkeypatch):
    batch = run.batcher.batch_at(0)
    prompts, chunk = list(batch["prompt"]), run.rollout_chunk
    assert (len(prompts), chunk, len(set(prompts))) == (16, 8, 4)  # 4 prompts x 4, 2 chunks
    want = [run.encode(prompts[lo:lo + chunk]) for lo in range(0, 16, chunk)]  # per chunk
    spy = Spy(run, monkeypatch)
    got = run.chunk_conditions(prompts)
    assert (spy.calls, spy.rows) == (1, 8)  # was 2 calls, 16 rows
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in w:
            assert g[name].sharding == w[name].sharding
            np.testing.assert_array_equal(np.asarray(g[name]), np.asarray(w[name]))


def test_the_update_keeps_each_devices_prompts_once(run):
    # 16 rows (4 prompts x 4) over 8 devices of 2 rows: one table row a device, each row's
    # index into its device's part gives the conditioning its rollout chunk had
    prompts = list(run.batcher.batch_at(0)["prompt"])
    chunks, kept = run.rollout_conditions(prompts)
    layout = run.layout
    assert (layout.row_shards, layout.cond_slots) == (8, 1)
    per_row = {k: np.concatenate([np.asarray(c[k]) for c in chunks]) for k in chunks[0]}
    index = np.asarray(kept["cond_index"])
    assert kept["cond_index"].sharding == chunks[0][next(iter(per_row))].sharding
    local = len(prompts) // layout.row_shards
    for name, table in kept["prompt_cond"].items():
        table = np.asarray(table)
        assert table.shape == (layout.row_shards * layout.cond_slots,) + per_row[name].shape[1:]
        assert table.dtype == per_row[name].dtype  # SD3 declares no storage dtype: float32
        for r in range(len(prompts)):
            np.testing.assert_array_equal(table[(r // local) * layout.cond_slots + index[r]],
                                          per_row[name][r], err_msg=f"{name} row {r}")


def test_repeats_of_one_prompt_in_a_chunk():
    # 2 prompts x 4 repeats over 2 processes of 4 rows: each process touches 1 group; a
    # group straddling processes makes both encode it
    assert max_local_groups(8, 4, 2) == 1
    assert max_local_groups(12, 4, 2) == 2
    assert max_local_groups(8, 4, 1) == 2
    assert max_local_groups(6, 1, 2) == 3


def _fake_rollout(events, run):
    """run.rollout's stand-in: records its dispatch, returns latents and pixels drawn from the
    keys it is given (so the keys' order shows in the result)."""
    def rollout(state, latents, cond, key, inputs=None):
        events.append(("dispatch", len([e for e in events if e[0] == "dispatch"])))
        pixels = jax.random.randint(key, latents.shape[:1] + (16, 16, 3), 0, 256).astype("uint8")
        return {"x0": latents}, jax.device_put(pixels, run.setup.batch_sharding())
    return rollout


def test_chunk_fetched_and_submitted_after_the_next_rollout_is_dispatched(run, monkeypatch):
    from wfm_jax.train import rl
    from wfm_jax.train.metrics import Timers
    events = []
    monkeypatch.setattr(run, "rollout", _fake_rollout(events, run))
    submit, get = run.rewards.submit, jax.device_get

    def recording_submit(media, prompts, **kw):
        events.append(("submit", len([e for e in events if e[0] == "submit"])))
        return submit(media, prompts, **kw)

    def recording_get(x):
        if getattr(x, "dtype", None) == np.uint8:
            events.append(("fetch", len([e for e in events if e[0] == "fetch"])))
        return get(x)
    monkeypatch.setattr(run.rewards, "submit", recording_submit)
    monkeypatch.setattr(jax, "device_get", recording_get)
    batch = run.batcher.batch_at(0)
    key = jax.random.key(7)
    out = rl.rollout_batch(run, None, batch, key, Timers())
    monkeypatch.undo()
    assert events == [("dispatch", 0), ("dispatch", 1), ("fetch", 0), ("submit", 0),
                      ("fetch", 1), ("submit", 1)]
    # the serial loop's keys and rewards: chunk by chunk, split as before
    prompts, chunk, pixels, x0 = list(batch["prompt"]), run.rollout_chunk, [], []
    for _lo in range(0, len(prompts), chunk):
        key, k_lat, k_alg = jax.random.split(key, 3)
        latents = run.initial_latents(k_lat, chunk)
        fields, px = _fake_rollout([], run)(None, latents, None, k_alg)
        pixels.append(np.asarray(px))
        x0.append(np.asarray(fields["x0"]))
    want = run.rewards.score(np.concatenate(pixels), prompts)
    np.testing.assert_array_equal(np.asarray(out["x0"]), np.concatenate(x0))
    np.testing.assert_array_equal(out["reward"], want.total)


# step N's metrics wait until step N + 1's data is encoded and, unless step N is saved, until
# step N + 1 is dispatched: the device is idle neither while the host loads data nor while it
# dispatches a step. save_freq 2: step 2's state must still be there when it is saved.
SFT_EVENTS = {
    100: [("encode", 1), ("step", 1), ("encode", 2), ("step", 2), ("fetch", 1), ("encode", 3),
          ("step", 3), ("fetch", 2), ("encode", 4), ("step", 4), ("fetch", 3), ("fetch", 4),
          ("save", 4)],  # the end of the run
    2: [("encode", 1), ("step", 1), ("encode", 2), ("step", 2), ("fetch", 1), ("encode", 3),
        ("fetch", 2), ("save", 2), ("step", 3), ("encode", 4), ("step", 4), ("fetch", 3),
        ("fetch", 4), ("save", 4)]}


@pytest.mark.slow  # four SFT steps end to end
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
@pytest.mark.parametrize("save_freq", sorted(SFT_EVENTS))
def test_sft_fetches_a_step_after_the_next_is_loaded_and_encoded(pipe_dir, tmp_path,
                                                                  monkeypatch, save_freq):
    from tests._rl_toy import metrics as logged
    from wfm_jax.train import setup as setup_lib
    from wfm_jax.train import sft
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    values = {"policy.model_name_or_path": pipe_dir, "train.output_dir": str(tmp_path / "out"),
              "policy.parallelism.data": 1, "policy.parallelism.fsdp": 8,
              "policy.diffusers.inference_size": "(16, 16)", "train.max_steps": 4,
              "train.log_freq": 1, "train.ckpt.save_freq": save_freq,
              "train.ckpt.export_safetensors": False,
              "train.train_policy.dataset.local_dir":
                  build_shapes_dataset(str(tmp_path / "shapes"), count=16, size=16, seed=0)}
    config = load_config(os.path.join(CONFIGS, "tiny_sft.py"),
                         [(k, str(v)) for k, v in values.items()])
    events, outs, seen = [], [], {}
    prepare, micro_step, fetch = (sft.SFTTrainer.prepare, sft.SFTTrainer.micro_step,
                                  sft.fetch_metrics)

    def encode(self, batch):
        with jax.transfer_guard_device_to_host("disallow"):  # nothing waits for the device
            out = prepare(self, batch)
        events.append(("encode", 1 + len([e for e in events if e[0] == "encode"])))
        return out

    def step(self, batch):
        with jax.transfer_guard_device_to_host("disallow"):
            out = micro_step(self, batch)
        outs.append(out)
        events.append(("step", len(outs)))
        return out

    def fetching(tree):  # (the step's outputs, its learning rate)
        events.append(("fetch", 1 + outs.index(tree[0][0])))
        return fetch(tree)
    monkeypatch.setattr(sft.SFTTrainer, "prepare", encode)
    monkeypatch.setattr(sft.SFTTrainer, "micro_step", step)
    monkeypatch.setattr(sft, "fetch_metrics", fetching)
    save = setup_lib.TrainSetup.save

    def saving(self, step, *args, **kwargs):
        started = save(self, step, *args, **kwargs)
        if started:  # the state saved is that step's own: its step counter says so
            assert int(jax.device_get(self.state.step)) == step
            events.append(("save", step))
        return started
    monkeypatch.setattr(setup_lib.TrainSetup, "save", saving)
    assert sft.run(config, on_step=lambda n, m: seen.update({n: m})) == 4
    assert events == SFT_EVENTS[save_freq]
    rows = logged(str(tmp_path / "out"))
    for n, out in enumerate(jax.device_get(outs), start=1):  # each step's own outputs
        for m in (rows[n], seen[n]):
            assert m["train/loss"] == float(out["loss"])
            assert m["optimizer/grad_norm"] == float(out["grad_norm"])


def _recording_loop(run, monkeypatch, events, max_steps=2):
    """run's loop with the sampler, the update, the logger and the saves replaced by recorders:
    ("dispatch", n) per rollout chunk, ("update", step), ("fetch", step) when its update
    metrics are waited for, ("log", step), ("save", step, final)."""
    import jax.numpy as jnp

    from wfm_jax.train import rl
    monkeypatch.setattr(run, "rollout", _fake_rollout(events, run))
    monkeypatch.setattr(run, "max_steps", max_steps)

    def dispatch_update(state, rollout, adv, key, step):
        events.append(("update", step))
        return state, (step, jnp.float32(step) / 8)

    def update_metrics(pending):
        events.append(("fetch", pending[0]))
        return {"train/loss": float(pending[1])}
    monkeypatch.setattr(run, "dispatch_update", dispatch_update)
    monkeypatch.setattr(run, "update_metrics", update_metrics)
    monkeypatch.setattr(run.logger, "log", lambda step, m: events.append(("log", step)))
    monkeypatch.setattr(run, "save", lambda state, step, final=False, export=True:
                        events.append(("save", step, final)))
    return rl._loop


def test_rl_update_metrics_fetched_after_the_next_rollout_is_dispatched(run, monkeypatch):
    events = []
    _recording_loop(run, monkeypatch, events)(run)
    # step 1's metrics wait only once step 2's first chunk is dispatched, and step 1 is logged
    # and saved before step 2 fetches or trains anything (2 chunks a step)
    assert [e for e in events if e[0] != "dispatch" or e[1] in (0, 2)] == [
        ("dispatch", 0), ("update", 1), ("dispatch", 2), ("fetch", 1), ("log", 1),
        ("save", 1, False), ("update", 2), ("fetch", 2), ("log", 2), ("save", 2, False),
        ("save", 2, True)]
    assert events.index(("save", 1, False)) < events.index(("dispatch", 3))


def test_rl_update_time_counts_the_wait_for_its_results(run, monkeypatch):
    """time/update is the update's dispatch plus the later wait for its metrics (the device's
    remaining update time), not the dispatch alone; the wait is not the next rollout's time."""
    import time
    events, logged = [], {}
    loop = _recording_loop(run, monkeypatch, events)
    monkeypatch.setattr(run, "update_metrics", lambda p: time.sleep(1.0) or {"train/loss": 0.5})
    monkeypatch.setattr(run.logger, "log", lambda step, m: logged.update({step: m}))
    loop(run)
    for step in (1, 2):
        assert logged[step]["time/update"] >= 1.0, logged[step]
    assert logged[2]["time/rollout"] < 1.0, logged[2]  # step 1's wait ran inside it


def test_rl_sigterm_and_nan_stop_at_the_step_boundary(run, monkeypatch):
    from wfm_jax.train import preempt
    from wfm_jax.train.metrics import NonFiniteLoss
    events = []
    loop = _recording_loop(run, monkeypatch, events, max_steps=3)
    monkeypatch.setattr(preempt, "requested", lambda: True)
    with pytest.raises(preempt.Stopped):
        loop(run)
    # step 1 checkpointed, step 2's rollout abandoned after its first dispatch, nothing after
    assert events[-4:] == [("fetch", 1), ("log", 1), ("save", 1, False), ("save", 1, True)]
    assert ("update", 2) not in events and events[-5] == ("dispatch", 2)
    monkeypatch.undo()
    events.clear()
    loop = _recording_loop(run, monkeypatch, events, max_steps=3)
    monkeypatch.setattr(run, "update_metrics", lambda p: events.append(("fetch", p[0])) or
                        {"train/loss": float("nan")})
    with pytest.raises(NonFiniteLoss):
        loop(run)
    assert events[-2:] == [("dispatch", 2), ("fetch", 1)]  # step 1: neither logged nor saved


@pytest.mark.slow  # two JAX processes on loopback, each building the tiny NFT run
def test_chunk_conditions_with_two_processes_equal_one(run, pipe_dir, tmp_path):
    # 2 processes x 4 CPU devices on one fsdp=8 mesh: each process's rows of every chunk
    # carry the conditioning one process gives those prompts (its encoder calls are collective)
    import json
    import sys

    from tests._processes import free_port, report, run_processes
    port, root = free_port(), os.path.dirname(CONFIGS)
    env = dict(os.environ, XLA_FLAGS=host_devices(4),
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    codes, tails = run_processes(
        [[sys.executable, "-m", "tests._two_process_conditions", str(i), str(port), pipe_dir,
          str(tmp_path)] for i in range(2)], cwd=root, env=env, log_dir=tmp_path, timeout=400)
    assert codes == [0, 0], report(codes, tails)
    every = []
    for i in range(2):
        meta = json.load(open(tmp_path / f"process_{i}.json"))
        got = np.load(tmp_path / f"process_{i}.npz")
        prompts, chunk = meta["prompts"], meta["chunk"]
        assert len(prompts) == 8 and chunk == 4  # 8 rows each, in chunks of 4
        assert meta["any"] == [True, False]  # one process's miss makes every process encode
        every += prompts
        unique = list(dict.fromkeys(prompts))
        want = run.encode(unique + [unique[-1]] * (run.rollout_chunk - len(unique)))
        want = {name: np.asarray(v)[:len(unique)] for name, v in want.items()}
        for k in range(len(prompts) // chunk):
            for name in want:
                rows = [want[name][unique.index(p)] for p in prompts[k * chunk:(k + 1) * chunk]]
                np.testing.assert_array_equal(got[f"{k}/{name}"], np.stack(rows), err_msg=name)
        # the update's table: this process's 4 devices x their slots; each of its rows' index
        # into its own device's part names that row's prompt
        slots, index = meta["slots"], got["cond_index"]
        assert slots == 1 and len(index) == len(prompts)  # 2 rows a device, 4 repeats a prompt
        for name in want:
            table = got[f"table/{name}"]
            assert len(table) == 4 * slots
            for i, p in enumerate(prompts):
                np.testing.assert_array_equal(table[(i // 2) * slots + index[i]],
                                              want[name][unique.index(p)], err_msg=name)
    assert sorted(every) == sorted(run.batcher.batch_at(0)["prompt"])  # the same global batch


def test_rl_step_failing_before_its_first_dispatch_keeps_the_previous_step(run, monkeypatch):
    # step 2's prompts fail to encode: step 1 is still logged and saved, then the error surfaces
    from wfm_jax.data.errors import DataError
    events = []
    loop = _recording_loop(run, monkeypatch, events, max_steps=3)
    conditions = run.rollout_conditions

    def failing(prompts):
        if ("update", 1) in events:
            raise DataError("bad prompt")
        return conditions(prompts)
    monkeypatch.setattr(run, "rollout_conditions", failing)
    with pytest.raises(DataError, match="bad prompt"):
        loop(run)
    assert events[-4:] == [("update", 1), ("fetch", 1), ("log", 1), ("save", 1, False)]
