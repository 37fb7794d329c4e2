"""Training logs: console progress bar, `metrics.jsonl`, Weights & Biases; timers; NaN guard.

Only process 0 writes anything; on other processes every method is a no-op, so loops call
them unconditionally.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any, Mapping

import jax
import numpy as np

# Shown in the progress bar when present: metric key -> short label.
BAR_KEYS = {"train/loss": "loss", "train/loss_avg": "loss", "train/reward_mean": "reward",
            "train/learning_rate": "lr"}


def to_python(value: Any) -> Any:
    """JSON-ready value: jax/numpy scalars -> float/int/bool, small arrays -> lists."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    arr = np.asarray(jax.device_get(value))
    if arr.ndim == 0:
        item = arr.item()
        return float(item) if isinstance(item, float) else item
    return arr.tolist()


class NonFiniteLoss(FloatingPointError):
    """A logged value became NaN/inf; the loop stops before saving this step."""

    def __init__(self, step: int, key: str, value: Any):
        self.step, self.key, self.value = step, key, value
        super().__init__(f"non-finite {key} = {value} at step {step}; training stopped, the "
                         f"last checkpoint saved before this step is kept")


def check_finite(step: int, metrics: Mapping[str, Any], keys=None) -> None:
    """Raise NonFiniteLoss naming the step and key if any (selected) numeric metric is NaN/inf.
    Call it before `Checkpointer.save` so a bad state is never written."""
    for key in (keys if keys is not None else metrics):
        value = metrics[key]
        if isinstance(value, (str, bool)) or value is None:
            continue
        arr = np.asarray(jax.device_get(value))
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            raise NonFiniteLoss(int(step), key, to_python(value))


class Timer:
    """`with Timer() as t: ...` then `t.elapsed` seconds. Wall time: block on device results
    (`jax.block_until_ready`) inside the block when timing jitted work."""

    def __init__(self):
        self.elapsed = 0.0
        self._t0 = None

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self._t0
        return False


class Timers:
    """Named phase timers summed over a step: `with timers("rollout"): ...`, then
    `timers.metrics()` -> {"time/rollout": s, ...} and `timers.reset()`."""

    def __init__(self, prefix: str = "time/"):
        self.prefix = prefix
        self.totals: dict[str, float] = {}

    def __call__(self, name: str):
        timers = self

        class _Phase(Timer):
            def __exit__(self, *exc):
                super().__exit__(*exc)
                timers.totals[name] = timers.totals.get(name, 0.0) + self.elapsed
                return False

        return _Phase()

    def metrics(self) -> dict[str, float]:
        return {self.prefix + k: v for k, v in self.totals.items()}

    def reset(self) -> None:
        self.totals.clear()


def _wandb_mode(cfg: Mapping) -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if cfg.get("mode"):
        return cfg["mode"]
    has_key = bool(os.environ.get("WANDB_API_KEY"))
    netrc = os.path.expanduser("~/.netrc")
    if not has_key and os.path.exists(netrc):
        with open(netrc, errors="ignore") as f:
            has_key = "api.wandb.ai" in f.read()
    return "online" if has_key else "offline"


def _init_wandb(cfg: Mapping, output_dir: str):
    """A wandb run, or None (with a warning) when wandb cannot start; an online start that
    fails (no network) falls back to offline."""
    try:
        import wandb
    except ImportError:
        warnings.warn("wandb is enabled but not installed; logging to metrics.jsonl only")
        return None
    mode = _wandb_mode(cfg)
    kwargs = dict(project=cfg.get("project") or "wfm_jax", entity=cfg.get("entity"),
                  name=cfg.get("name"), group=cfg.get("group"), tags=cfg.get("tags"),
                  id=cfg.get("id"), resume="allow" if cfg.get("id") else None,
                  config=dict(cfg.get("config") or {}),
                  dir=cfg.get("dir") or output_dir)
    for try_mode in ([mode, "offline"] if mode == "online" else [mode]):
        try:
            return wandb.init(mode=try_mode, settings=wandb.Settings(
                init_timeout=float(cfg.get("init_timeout", 60))), **kwargs)
        except Exception as e:  # no network, bad credentials, ...: never fatal
            warnings.warn(f"wandb init ({try_mode}) failed: {type(e).__name__}: {e}")
    return None


class MetricsLogger:
    """Console bar + `output_dir/metrics.jsonl` + optional wandb, on process 0.

    wandb_cfg: None/{} or a mapping with `enable` (or `enabled`), `project`, `entity`, `name`,
    `group`, `tags`, `id` (resume that run), `mode`, `dir`, `config`. Mode: $WANDB_MODE, else
    cfg mode, else online when an API key is configured, otherwise offline.
    start_step: the step a resumed run continues from; lines of metrics.jsonl with a larger step
    (written after that checkpoint by the killed run) are dropped so the file reads as one run.
    """

    def __init__(self, output_dir: str, total_steps: int | None = None,
                 wandb_cfg: Mapping | None = None, start_step: int = 0,
                 progress: bool = True):
        self.active = jax.process_index() == 0
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.run = None
        self._bar = None
        self._file = None
        if not self.active:
            return
        os.makedirs(output_dir, exist_ok=True)
        if start_step and os.path.exists(self.path):
            self._truncate_after(start_step)
        elif not start_step and os.path.exists(self.path):
            os.replace(self.path, self.path + ".old")
        self._file = open(self.path, "a", encoding="utf-8")
        if progress:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step",
                             dynamic_ncols=True, mininterval=0.5)
        cfg = dict(wandb_cfg or {})
        if cfg.get("enable", cfg.get("enabled", False)):
            self.run = _init_wandb(cfg, output_dir)

    def _truncate_after(self, step: int) -> None:
        kept = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    if json.loads(line).get("step", 0) <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except json.JSONDecodeError:  # a line cut off by the kill
                    continue
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        """Write one record {"step": step, **metrics}; returns it (python values)."""
        record = {"step": int(step)}
        record.update({k: to_python(v) for k, v in metrics.items()})
        if not self.active:
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._bar is not None:
            # postfix first: update() redraws, and must draw this step's values, not the last's
            shown = {label: f"{record[k]:.4g}" for k, label in BAR_KEYS.items()
                     if isinstance(record.get(k), (int, float))}
            if shown:
                self._bar.set_postfix(shown, refresh=False)
            self._bar.update(max(int(step) - self._bar.n, 0))
        if self.run is not None:
            numeric = {k: v for k, v in record.items()
                       if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            self._wandb_call(lambda: self.run.log(numeric, step=int(step)))
        return record

    def log_image(self, key: str, image: Any, caption: str | None = None,
                  step: int | None = None) -> None:
        """An image (file path, PIL image or HWC array) to wandb; no-op without wandb."""
        if not self.active or self.run is None:
            return
        import wandb

        def send():
            data = image if isinstance(image, str) else (
                image if hasattr(image, "save") else np.asarray(jax.device_get(image)))
            self.run.log({key: wandb.Image(data, caption=caption)}, step=step)

        self._wandb_call(send)

    def log_video(self, key: str, path: str, caption: str | None = None,
                  step: int | None = None) -> None:
        """An mp4 file to wandb (wandb.Video); no-op without wandb."""
        if not self.active or self.run is None:
            return
        import wandb
        self._wandb_call(lambda: self.run.log(
            {key: wandb.Video(path, caption=caption, format="mp4")}, step=step))

    def _wandb_call(self, fn) -> None:
        try:
            fn()
        except Exception as e:  # a logging hiccup must never stop training
            warnings.warn(f"wandb logging failed: {type(e).__name__}: {e}")

    def close(self) -> None:
        if not self.active:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.run is not None:
            self._wandb_call(self.run.finish)
            self.run = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
