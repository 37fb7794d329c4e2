"""The first-run build of the pretrained tiny pipeline is as safe as a training run: SIGTERM
stops it with its work kept (DIR.build) and the next run resumes it; a kill -9 leaves nothing
that the next run does not clean up or resume; a second build or run on the same folder is
refused up front, naming the owner's pid. The builds use QUICK settings (seconds); the kills are
real signals to real child processes (`python -m wfm_jax.tiny --pretrained` with QUICK)."""
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests._resume import compile_cache_env
from tests._support.paths import REPO_ROOT
from wfm_jax.io.lock import LockHeldError, exclusive_lock
from wfm_jax.train.pretrain import QUICK, is_built, lock_file, work_dir

ROOT = REPO_ROOT
SETTINGS = dataclasses.replace(QUICK, sft_steps=4)

# the CLI with QUICK settings and, optionally, a real signal sent to itself at a chosen point
CHILD = """
import dataclasses, os, signal, sys, time
import wfm_jax.cli.tiny as cli
from wfm_jax.train import pretrain
settings = dataclasses.replace(pretrain.QUICK, sft_steps=4)
cli.PretrainSettings = lambda seed: settings
directory, sig, at = sys.argv[1], sys.argv[2], sys.argv[3]
if at == "sft_step_2":
    from wfm_jax.train import sft
    real, calls = sft.fetch_metrics, []
    def fetch(tree):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), getattr(signal, sig))
        return real(tree)
    sft.fetch_metrics = fetch
elif at == "final_rename":  # inside the temporary folder renamed into place as DIR
    real_loss = pretrain._final_loss
    def final_loss(out):
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(30)
        return real_loss(out)
    pretrain._final_loss = final_loss
elif at == "hold":  # hold the lock mid-build until the test says go
    import wfm_jax.worlds.shapes.vae as vae
    real_fit = vae.fit_vae
    def fit_vae(*a, **k):
        open(directory + ".ready", "w").close()
        for _ in range(600):
            if os.path.exists(directory + ".go"):
                break
            time.sleep(0.2)
        return real_fit(*a, **k)
    vae.fit_vae = fit_vae
sys.exit(cli.main(["--pretrained", directory]))
"""


_COMPILE_CACHE: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _children_share_compiles(tmp_path_factory):
    """Every child builds the same QUICK pipeline: one on-disk compilation cache for the module
    lets the later children load the programs the first compiled (a hit is the executable of
    the same HLO, so it cannot change what a child computes)."""
    _COMPILE_CACHE[:] = [str(tmp_path_factory.mktemp("jax_cache"))]


def _env():
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", **compile_cache_env(_COMPILE_CACHE[0])}


def _build(directory, sig="none", at="none", **kw):
    return subprocess.run([sys.executable, "-c", CHILD, directory, sig, at], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=600, **kw)


def _left(tmp_path):
    return sorted(os.listdir(tmp_path))


@pytest.mark.slow
def test_sigterm_mid_build_says_so_and_the_rerun_resumes(tmp_path):
    d = str(tmp_path / "shapes")
    first = _build(d, "SIGTERM", "sft_step_2")
    assert first.returncode == 143, first.stderr[-2000:]
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("error: stopped by SIGTERM during the pretrained build of")
    # the signal comes while step 2's metrics are fetched, after step 3 is dispatched (the SFT
    # loop queues a step behind one it need not save): step 3 is the last one done and saved
    assert "SFT step 3 of 4" in last and f"{d}.build" in last
    assert "run the same command again to resume the build" in last
    assert "--config.train.resume" not in first.stderr  # the old, untrue advice
    # what the message promises is there: the work, with the SFT checkpoint of step 3
    assert _left(tmp_path) == ["shapes.build"]
    assert sorted(os.listdir(os.path.join(work_dir(d), "sft", "checkpoints"))) == ["3"]

    second = _build(d)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming the interrupted build" in second.stdout
    assert "resuming from step 3" in second.stdout  # the SFT goes on, it does not start over
    assert is_built(d, SETTINGS)
    assert _left(tmp_path) == ["shapes"]  # no work dir, temporary folder or lock left


@pytest.mark.slow
def test_kill_9_leaves_a_temporary_that_the_next_run_removes(tmp_path):
    d = str(tmp_path / "shapes")
    first = _build(d, "SIGKILL", "final_rename")
    assert first.returncode == -signal.SIGKILL
    left = _left(tmp_path)
    assert "shapes" not in left and "shapes.build" in left
    assert any(n.startswith(".shapes.tmp-") for n in left), left
    with open(lock_file(d)) as f:  # a stale lock: its owner is dead
        pid = int(f.read().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    second = _build(d)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "removed 1 temporary folder(s) a killed build left" in second.stdout
    assert "resuming the interrupted build" in second.stdout
    assert "SFT for" not in second.stdout  # the finished SFT is reused, not run again
    assert is_built(d, SETTINGS)
    assert _left(tmp_path) == ["shapes"]


@pytest.mark.slow
def test_a_second_build_of_the_same_folder_is_refused_up_front(tmp_path):
    d = str(tmp_path / "shapes")
    owner = subprocess.Popen([sys.executable, "-c", CHILD, d, "none", "hold"], cwd=ROOT,
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if os.path.exists(d + ".ready") or owner.poll() is not None:
                break
            time.sleep(0.25)
        assert os.path.exists(d + ".ready"), owner.communicate()
        start = time.perf_counter()
        second = _build(d)
        assert second.returncode == 2
        assert second.stderr.strip() == (
            f"error: the pretrained pipeline {d} is in use by another run (pid {owner.pid} on "
            f"{socket.gethostname()}; lock file {lock_file(d)}); wait for it to finish or stop it")
        assert "pretrain:" not in second.stdout  # it built nothing
        assert time.perf_counter() - start < 120
    finally:
        open(d + ".go", "w").close()
        _, err = owner.communicate(timeout=600)
    assert owner.returncode == 0, err[-2000:]  # the owner was not disturbed
    assert is_built(d, SETTINGS)


def test_lock_refuses_a_second_holder_and_a_dead_owner_is_stale(tmp_path):
    path = str(tmp_path / ".x.lock")
    with exclusive_lock(path, "x"):
        with open(path) as f:
            assert f.read().split()[0] == str(os.getpid())
        with pytest.raises(LockHeldError, match=rf"x is in use by another run \(pid {os.getpid()} "):
            with exclusive_lock(path, "x"):
                pass
    assert not os.path.exists(path)
    # a lock file whose owner died (no flock held on it) is taken over
    with open(path, "w") as f:
        f.write("999999999 somewhere\n")
    with exclusive_lock(path, "x"), open(path) as f:
        assert f.read().split()[0] == str(os.getpid())
    assert not os.path.exists(path)


def test_a_second_training_run_on_the_same_output_dir_is_refused_before_it_builds(tmp_path, capsys):
    from wfm_jax.cli.main import main
    out, model = tmp_path / "run", tmp_path / "model"
    with exclusive_lock(str(tmp_path / ".run.lock"), f"train.output_dir {out}"):
        code = main(["--config", os.path.join(ROOT, "configs", "tiny_grpo.py"),
                     f"--config.train.output_dir={out}",
                     f"--config.policy.model_name_or_path={model}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (f"error: train.output_dir {out} is in use by another run (pid {os.getpid()} on "
                   f"{socket.gethostname()}; lock file {tmp_path / '.run.lock'}); wait for it to "
                   f"finish or stop it")
    assert _left(tmp_path) == []  # nothing built, nothing written
