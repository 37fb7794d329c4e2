"""`python -m wfm_jax.main` end to end on the tiny SFT recipe, the way a user runs and stops it:
SIGTERM (preemption) stops after the step with a checkpoint and the run resumes from it; stale
export temporaries of a killed run are removed at start; the console says so, and says when it
saves, resumes and exports."""
from __future__ import annotations

import os
import signal

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.cli import main as wmain
from wfm_jax.train.metrics import MetricsLogger

pytestmark = [pytest.mark.slow, pytest.mark.compile_bound]

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    root = tmp_path_factory.mktemp("lifecycle_assets")
    return (build_tiny_pipeline(str(root / "pipe"), seed=0),
            build_shapes_dataset(str(root / "shapes"), count=8, size=16, seed=0))


def argv(assets, out_dir, *extra):
    pipe, shapes = assets
    return ["--config", f"{ROOT}/configs/tiny_sft.py",
            f"--config.policy.model_name_or_path={pipe}",
            f"--config.train.train_policy.dataset.local_dir={shapes}",
            "--config.policy.diffusers.inference_size=(16, 16)",
            f"--config.train.output_dir={out_dir}", "--config.train.max_steps=4",
            "--config.train.optm_warmup_steps=0", "--config.train.ckpt.save_freq=10",
            "--config.train.ckpt.save_mode=sync", *extra]


def test_sigterm_saves_a_checkpoint_and_resumes(assets, tmp_path, monkeypatch, capsys):
    stale = tmp_path / "safetensors" / ".step_3.tmp-0123abcd"
    os.makedirs(stale / "transformer")  # what a kill during an export leaves
    real_log = MetricsLogger.log

    def log_then_sigterm(self, step, metrics):
        record = real_log(self, step, metrics)
        if step == 2:  # the scheduler preempts the job during step 2's bookkeeping, when
            os.kill(os.getpid(), signal.SIGTERM)  # step 3 is already queued (train/sft.py run)
        return record

    monkeypatch.setattr(MetricsLogger, "log", log_then_sigterm)
    rc = wmain.main(argv(assets, tmp_path))
    captured = capsys.readouterr()
    err = captured.err
    # step 3, dispatched before step 2's metrics were in, is finished and saved: its state is
    # the last one there (step 2's was donated to it)
    assert f"checkpoint step 3 saved in {tmp_path}/checkpoints/3" in captured.out.splitlines()
    assert any(l.startswith("removed 1 half-written export(s)") for l in captured.out.splitlines())
    assert rc == wmain.EXIT_PREEMPTED, err
    assert [l for l in err.splitlines() if l.startswith("error:")] == [
        "error: stopped by SIGTERM after step 3, its checkpoint is saved; resume with "
        "--config.train.resume=True"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]  # save_freq 10: forced
    assert not stale.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is uninstalled

    monkeypatch.setattr(MetricsLogger, "log", real_log)
    assert wmain.main(argv(assets, tmp_path, "--config.train.resume=True")) == 0
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4"]
    assert sorted(os.listdir(tmp_path / "safetensors")) == ["step_4"]
    out = capsys.readouterr().out.splitlines()
    assert f"resuming from step 3 (checkpoint {tmp_path}/checkpoints/3)" in out
    assert (f"exported step 4 to {tmp_path}/safetensors/step_4 (diffusers pipeline)") in out
