"""MetricsLogger (jsonl, resume truncation, wandb offline, wandb failure), timers, NaN guard."""
import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.train.metrics import MetricsLogger, NonFiniteLoss, Timer, Timers, check_finite


def _read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_jsonl_lines_parse_and_resume_drops_later_steps(tmp_path):
    with MetricsLogger(str(tmp_path), total_steps=5) as logger:
        for step in (1, 2, 3):
            rec = logger.log(step, {"train/loss": jnp.float32(0.5 / step),
                                    "train/learning_rate": np.float64(1e-3),
                                    "rollout/n": jnp.int32(step), "tag": "a"})
            assert isinstance(rec["train/loss"], float)
        # flushed line by line: a reader sees every record while the run is still going
        assert [r["step"] for r in _read(logger.path)] == [1, 2, 3]
    records = _read(tmp_path / "metrics.jsonl")
    np.testing.assert_allclose([r["train/loss"] for r in records], [0.5, 0.25, 0.5 / 3],
                               rtol=1e-6)
    assert records[2]["rollout/n"] == 3 and records[0]["tag"] == "a"

    with open(tmp_path / "metrics.jsonl", "a") as f:   # a line cut off by a kill
        f.write('{"step": 4, "train/lo')
    with MetricsLogger(str(tmp_path), total_steps=5, start_step=2) as logger:
        logger.log(3, {"train/loss": 9.0})
    records = _read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and records[2]["train/loss"] == 9.0


def test_check_finite_names_step_and_key():
    check_finite(4, {"train/loss": jnp.float32(1.0), "note": "ok", "n": 3})
    with pytest.raises(NonFiniteLoss, match=r"train/loss = nan at step 7") as err:
        check_finite(7, {"train/kl": 0.1, "train/loss": jnp.float32(np.nan)})
    assert err.value.step == 7 and err.value.key == "train/loss"
    with pytest.raises(NonFiniteLoss, match="grad_norm"):
        check_finite(2, {"optimizer/grad_norm": np.array([1.0, np.inf])})
    check_finite(2, {"train/loss": 1.0, "other": np.nan}, keys=["train/loss"])


def test_timers_sum_phases():
    timers = Timers()
    for _ in range(2):
        with timers("rollout"):
            sum(range(1000))
    with timers("update") as t:
        pass
    m = timers.metrics()
    assert set(m) == {"time/rollout", "time/update"}
    assert m["time/update"] == t.elapsed and all(v >= 0 for v in m.values())
    timers.reset()
    assert timers.metrics() == {}
    with Timer() as t2:
        pass
    assert t2.elapsed >= 0


def test_wandb_offline_smoke(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"enable": True, "project": "wfm_jax_test", "dir": str(tmp_path / "wb"),
           "config": {"lr": 1e-3}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # any swallowed wandb failure would warn
        logger = MetricsLogger(str(tmp_path / "out"), total_steps=2, wandb_cfg=cfg)
        assert logger.run is not None
        logger.log(1, {"train/loss": jnp.float32(0.25)})
        logger.log_image("val/grid", np.zeros((8, 8, 3), np.uint8), caption="a prompt", step=1)
        logger.log(2, {"train/loss": 0.125})
        # logging step 2 committed step 1 (scalar + image) into the offline run
        summary = dict(logger.run.summary)
        assert abs(summary["train/loss"] - 0.25) < 1e-7 and "val/grid" in summary
        run_dir = logger.run.dir
        logger.close()
    assert run_dir.startswith(str(tmp_path / "wb"))
    assert _read(tmp_path / "out" / "metrics.jsonl")[0]["step"] == 1


def test_wandb_failure_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def broken_init(**kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(wandb, "init", broken_init)
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.warns(UserWarning, match="no network"):
        logger = MetricsLogger(str(tmp_path), total_steps=1, wandb_cfg={"enable": True})
    assert logger.run is None
    logger.log(1, {"train/loss": 1.0})
    logger.log_image("img", np.zeros((2, 2, 3), np.uint8))
    logger.close()
    assert _read(tmp_path / "metrics.jsonl") == [{"step": 1, "train/loss": 1.0}]


def test_progress_bar_shows_each_steps_own_values(tmp_path, capsys):
    import time
    with MetricsLogger(str(tmp_path), total_steps=3) as logger:
        for step, loss in ((1, 0.111), (2, 0.222), (3, 0.333)):
            time.sleep(0.6)  # past the bar's redraw interval: every update draws
            logger.log(step, {"train/loss": loss, "train/reward_mean": -loss})
    frames = [f for f in capsys.readouterr().err.replace("\n", "\r").split("\r") if "/3" in f]
    for step, loss in ((1, 0.111), (2, 0.222), (3, 0.333)):
        drawn = [f for f in frames if f" {step}/3 " in f]
        assert drawn, frames
        # the bar once drew step N with step N-1's loss and reward
        assert all(f"loss={loss}" in f and f"reward={-loss}" in f for f in drawn), drawn
