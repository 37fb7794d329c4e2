"""Remote service settings: URLs, token, timeouts, retries, budget.

Resolution order for the URLs and the token: config keys, then ``REMOTE_REWARD_*``, then the legacy
``WFM_REWARD_*`` environment variables. cosmos-rl's enqueue timeout variables
(``REMOTE_REWARD_ENQUEUE_TIMEOUT_S`` / ``_BASE_S`` / ``_PER_MB_S`` / ``_MIN_S`` / ``_MAX_S``,
``REMOTE_REWARD_ENQUEUE_CONNECT_TIMEOUT_S``) set the same timeouts, below the config keys.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reward_client.errors import RewardConfigError
from reward_client.protocol import ENQUEUE_PATH, PING_PATH

ENV_VARS = {
    "token": ("REMOTE_REWARD_TOKEN", "WFM_REWARD_TOKEN"),
    "enqueue_url": ("REMOTE_REWARD_ENQUEUE_URL", "WFM_REWARD_ENQUEUE_URL"),
    "fetch_url": ("REMOTE_REWARD_FETCH_URL", "WFM_REWARD_FETCH_URL"),
}


@dataclass(frozen=True)
class RemoteConfig:
    enqueue_url: str
    fetch_url: str
    token: str | None = None
    ping_url: str | None = None  # derived from enqueue_url when it ends in /api/reward/enqueue
    connect_timeout_s: float = 10.0
    # Enqueue read timeout = base + per_mb * payload MB, clamped to [min, max] (cosmos-rl's rule).
    enqueue_timeout_base_s: float = 30.0
    enqueue_timeout_per_mb_s: float = 3.0
    enqueue_timeout_min_s: float = 60.0
    enqueue_timeout_max_s: float = 600.0
    pull_timeout_s: float = 10.0
    max_attempts: int = 60  # failed attempts (errors, 5xx, timeouts) per request; 'not ready' polls excluded
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_jitter: float = 0.5
    poll_initial_s: float = 0.2
    poll_max_s: float = 2.0
    budget_s: float = 1800.0  # enqueue + every pull of one batch

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_s") and not (isinstance(value, (int, float)) and value >= 0):
                raise RewardConfigError(f"remote reward setting {field.name}={value!r} must be a number >= 0")
        if not 0.0 <= self.backoff_jitter <= 1.0:
            raise RewardConfigError(f"remote reward setting backoff_jitter={self.backoff_jitter} must be in [0, 1]")
        if self.max_attempts < 1:
            raise RewardConfigError(f"remote reward setting max_attempts={self.max_attempts} must be >= 1")

    def enqueue_read_timeout(self, nbytes: int) -> float:
        grown = self.enqueue_timeout_base_s + self.enqueue_timeout_per_mb_s * nbytes / 1e6
        return min(self.enqueue_timeout_max_s, max(self.enqueue_timeout_min_s, grown))

    def ping_endpoint(self) -> str:
        if self.ping_url:
            return self.ping_url
        if self.enqueue_url.rstrip("/").endswith(ENQUEUE_PATH):
            return self.enqueue_url.rstrip("/")[: -len(ENQUEUE_PATH)] + PING_PATH
        raise RewardConfigError(
            f"cannot derive the ping URL from enqueue URL {self.enqueue_url!r}: set the 'ping_url' key")

    def redacted(self) -> dict:
        out = dataclasses.asdict(self)
        out["token"] = "***" if self.token else None
        return out


FIELDS = tuple(f.name for f in dataclasses.fields(RemoteConfig))
# cosmos-rl's client reads its enqueue timeouts from these; a config key still wins.
TIMEOUT_ENV = {
    "REMOTE_REWARD_ENQUEUE_TIMEOUT_BASE_S": ("enqueue_timeout_base_s",),
    "REMOTE_REWARD_ENQUEUE_TIMEOUT_PER_MB_S": ("enqueue_timeout_per_mb_s",),
    "REMOTE_REWARD_ENQUEUE_TIMEOUT_MIN_S": ("enqueue_timeout_min_s",),
    "REMOTE_REWARD_ENQUEUE_TIMEOUT_MAX_S": ("enqueue_timeout_max_s",),
    "REMOTE_REWARD_ENQUEUE_TIMEOUT_S": ("enqueue_timeout_min_s", "enqueue_timeout_max_s"),  # fixed
    "REMOTE_REWARD_ENQUEUE_CONNECT_TIMEOUT_S": ("connect_timeout_s",),
}


def _timeouts_from_env(environ: Mapping[str, str]) -> dict[str, float]:
    out = {}
    for var, fields in TIMEOUT_ENV.items():  # the fixed timeout comes last and wins
        text = environ.get(var, "").strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise RewardConfigError(f"environment variable {var}={text!r} is not a number of seconds") from None
        out.update(dict.fromkeys(fields, value))
    return out


def _from_env(name: str, environ: Mapping[str, str]) -> str | None:
    for var in ENV_VARS[name]:
        if environ.get(var):
            return environ[var]
    return None


def resolve_remote_config(cfg: Mapping[str, Any] | None = None,
                          environ: Mapping[str, str] | None = None) -> RemoteConfig | None:
    """-> RemoteConfig, or None when no service is configured anywhere."""
    environ = os.environ if environ is None else environ
    cfg = dict(cfg or {})
    for key in cfg:
        if key not in FIELDS:
            hint = difflib.get_close_matches(key, FIELDS, n=1)
            raise RewardConfigError(f"unknown remote reward key {key!r}"
                                    + (f"; did you mean {hint[0]!r}?" if hint else f"; known: {FIELDS}"))
    for name in ENV_VARS:
        if cfg.get(name) is None:
            cfg[name] = _from_env(name, environ)
    for name, value in _timeouts_from_env(environ).items():
        cfg.setdefault(name, value)
    if not cfg["enqueue_url"] and not cfg["fetch_url"]:
        return None
    for name in ("enqueue_url", "fetch_url"):
        if not cfg[name]:
            raise RewardConfigError(
                f"remote reward {name} is not set: set the config key {name!r} or {ENV_VARS[name][0]}")
    return RemoteConfig(**cfg)
