"""End to end SFT on the tiny pipeline: the loss falls (full and LoRA), the exports load in
diffusers torch and give the JAX model's velocity, a killed run resumes to the same losses, two
jax.distributed processes give the same losses as one, and a NaN loss stops the run keeping the
last good checkpoint."""
from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import pytest

from tests._processes import free_port, report, run_processes
from tests._resume import compile_cache_env
from tests._support.paths import REPO_ROOT
from tests._support.xla import host_devices
from wfm_jax.cli import main as wmain
from wfm_jax.config.recipe import load_config
from wfm_jax.train import sft

# compile_bound for the whole file: full_run is built by a marked test and the resume test
# compares with it bit for bit, so both must compile at one level (tests/_support/xla.py)
pytestmark = [pytest.mark.slow, pytest.mark.compile_bound]

ROOT = REPO_ROOT
STEPS = 12
SIZE = "(16, 16)"  # 8 x 8 latent patches: cheap steps; compile time dominates anyway


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("sft_assets")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes"), count=16, size=32, seed=0))


def _overrides(assets, out_dir, **extra):
    pipe, shapes = assets
    values = {"policy.model_name_or_path": pipe, "train.train_policy.dataset.local_dir": shapes,
              "train.output_dir": str(out_dir), "policy.diffusers.inference_size": SIZE,
              "train.ckpt.save_freq": "3", "train.ckpt.max_keep": "10",
              "train.max_steps": str(STEPS), **extra}
    return [(k.replace("__", "."), str(v)) for k, v in values.items()]


def _config(recipe, assets, out_dir, **extra):
    return load_config(f"{ROOT}/configs/{recipe}", _overrides(assets, out_dir, **extra))


def _metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def _losses(out_dir, steps):
    metrics = _metrics(out_dir)
    return np.array([metrics[s]["train/loss"] for s in steps])


def _assert_loss_falls(out_dir):
    loss = _losses(out_dir, range(1, STEPS + 1))
    assert np.all(np.isfinite(loss))
    assert loss[-3:].mean() < loss[:3].mean() - 0.05, loss


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 4, 16, 16)).astype(np.float32),
            rng.standard_normal((2, 10, 32)).astype(np.float32),
            rng.standard_normal((2, 64)).astype(np.float32),
            np.array([31.5, 870.25], np.float32))


def _torch_velocity(transformer):
    import torch
    x, ctx, pooled, t = (torch.from_numpy(a) for a in _inputs())
    with torch.no_grad():
        return transformer(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled,
                           timestep=t).sample.numpy()


def _jax_velocity(setup, params):
    return np.asarray(jax.jit(lambda p, *a: setup.merge(p)(*a))(params, *_inputs()))


@pytest.fixture(scope="module")
def full_run(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    trainer = sft.SFTTrainer(_config("tiny_sft.py", assets, out))
    assert trainer.run() == STEPS
    return out, trainer.setup


@pytest.fixture(scope="module")
def lora_run(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    config = _config("tiny_sft_lora.py", assets, out, policy__parallelism__data=4,
                     policy__parallelism__fsdp=2, train__ckpt__save_freq=STEPS)
    trainer = sft.SFTTrainer(config)
    assert trainer.run() == STEPS
    return out, trainer.setup


def test_full_finetune_loss_falls_and_export_matches(full_run, assets):
    from diffusers import StableDiffusion3Pipeline
    out, setup = full_run
    _assert_loss_falls(out)
    # exported with every checkpoint
    assert set(os.listdir(out / "safetensors")) == {f"step_{s}" for s in (3, 6, 9, 12)}
    pipe = StableDiffusion3Pipeline.from_pretrained(str(out / "safetensors" / f"step_{STEPS}"))
    want = _torch_velocity(pipe.transformer)
    np.testing.assert_allclose(_jax_velocity(setup, setup.state.ema), want, atol=1e-4)
    # EMA is what got exported: the raw trained weights give another velocity
    assert np.abs(_jax_velocity(setup, setup.state.params) - want).max() > 1e-3


def test_lora_loss_falls_and_export_matches(lora_run, assets):
    from diffusers import StableDiffusion3Pipeline
    out, setup = lora_run
    _assert_loss_falls(out)
    assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(setup.state.params))
    lora_dir = out / "safetensors" / f"step_{STEPS}" / "lora"
    assert sorted(os.listdir(lora_dir)) == ["adapter_config.json", "model.safetensors"]
    pipe = StableDiffusion3Pipeline.from_pretrained(assets[0])
    base = _torch_velocity(pipe.transformer)
    pipe.load_lora_weights(str(lora_dir), weight_name="model.safetensors", adapter_name="default")
    want = _torch_velocity(pipe.transformer)
    assert np.abs(want - base).max() > 1e-3  # the adapter does something
    np.testing.assert_allclose(_jax_velocity(setup, setup.state.ema), want, atol=1e-4)


class _Killed(Exception):
    pass


def test_kill_and_resume_gives_the_same_losses(full_run, assets, tmp_path):
    base_out, _ = full_run

    def kill_after_4(step, metrics):
        if step == 4:
            raise _Killed()

    config = _config("tiny_sft.py", assets, tmp_path, train__max_steps=6)
    with pytest.raises(_Killed):
        sft.run(config, on_step=kill_after_4)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
    assert max(_metrics(tmp_path)) == 4

    resumed = _config("tiny_sft.py", assets, tmp_path, train__max_steps=6, train__resume=True)
    assert sft.run(resumed) == 6
    metrics, base = _metrics(tmp_path), _metrics(base_out)
    assert sorted(metrics) == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):  # bit-identical: same data, RNG, optimizer and EMA state
        for key in ("train/loss", "optimizer/grad_norm", "train/learning_rate"):
            assert metrics[step][key] == base[step][key], (step, key)


def test_nan_loss_stops_and_keeps_last_checkpoint(assets, tmp_path, monkeypatch, capsys):
    original = sft.SFTTrainer.micro_step

    def nan_at_step_5(self, batch):
        out = original(self, batch)
        if int(self.setup.state.step) == 5:
            out = dict(out, loss=out["loss"] * np.nan)
        return out

    monkeypatch.setattr(sft.SFTTrainer, "micro_step", nan_at_step_5)
    args = [f"--config.{k}={v}" for k, v in _overrides(assets, tmp_path, train__max_steps=6)]
    rc = wmain.main(["--config", f"{ROOT}/configs/tiny_sft.py", *args])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == wmain.EXIT_TRAINING_FAILED
    assert errors == ["error: non-finite train/loss = nan at step 5; training stopped, the last "
                      "checkpoint saved before this step is kept"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
    assert sorted(os.listdir(tmp_path / "safetensors")) == ["step_3"]
    assert max(_metrics(tmp_path)) == 4


def test_two_processes_match_one_through_a_sigterm_and_a_resume(full_run, assets, tmp_path):
    """Two jax.distributed processes train as one: SIGTERM to process 1 alone after step 1 stops
    both after the same step (their vote, train/preempt.py) with its checkpoint and exit 143
    (each through the distributed shutdown barrier); resumed, they end on the one-process
    run's losses, step for step."""
    import signal
    import time
    base_out, _ = full_run
    port = free_port()
    args = [f"--config.{k}={v}" for k, v in _overrides(assets, tmp_path)]
    args += [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
             "--config.distributed.num_processes=2"]
    # one on-disk compilation cache for the four processes: the resumed pair loads the programs
    # the first pair compiled (a hit is the executable of the same HLO: it changes nothing)
    env = dict(os.environ, XLA_FLAGS=host_devices(4), **compile_cache_env(tmp_path / "jax_cache"))

    def logged() -> bool:
        try:
            return bool(_metrics(tmp_path))
        except (OSError, ValueError):  # not written yet, or a line half written
            return False

    def sigterm_after_a_step(procs) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            if logged():
                procs[1].send_signal(signal.SIGTERM)
                return
            time.sleep(0.05)

    def both(*extra, **kw):
        return run_processes(
            [[sys.executable, "-m", "wfm_jax.main", "--config", f"{ROOT}/configs/tiny_sft.py",
              *args, *extra, f"--config.distributed.process_id={i}"] for i in range(2)],
            cwd=ROOT, env=env, log_dir=tmp_path, timeout=300, **kw)
    codes, tails = both(while_running=sigterm_after_a_step)
    assert codes == [wmain.EXIT_PREEMPTED] * 2, report(codes, tails)
    stopped = max(_metrics(tmp_path))
    assert 1 <= stopped < STEPS
    assert str(stopped) in os.listdir(tmp_path / "checkpoints")
    codes, tails = both("--config.train.resume=True")
    assert codes == [0, 0], report(codes, tails)
    np.testing.assert_allclose(_losses(tmp_path, range(1, STEPS + 1)),
                               _losses(base_out, range(1, STEPS + 1)), rtol=1e-5)
    assert os.path.isdir(tmp_path / "safetensors" / f"step_{STEPS}" / "transformer")
