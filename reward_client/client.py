"""HTTP client for reward services speaking the cosmos-rl protocol.

Retries connection errors, timeouts, 408/429/5xx and malformed answers with exponential backoff and
jitter, up to ``max_attempts`` failed attempts per request; a 400 on pull means "not ready" and is
polled without counting as a failure. Every request and sleep draws from one ``Deadline``.
401/403, 413, 404 and other 4xx answers are final and raise ``RewardServiceError`` at once.

Retrying an enqueue whose answer was lost can leave an orphan task on the service; the reference
server expires it after its TTL.
"""
from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import requests

from reward_client import protocol
from reward_client.backoff import Deadline, backoff_delay, poll_delay
from reward_client.config import RemoteConfig
from reward_client.errors import (
    RewardConfigError,
    RewardProtocolError,
    RewardServiceError,
    RewardUnavailableError,
)

RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}
# cosmos-rl's service answers 'not ready' forever for a task it dropped without telling anyone.
DROPPED_HINT = ("; 'not ready' until the end usually means the service dropped the task: an "
                "unknown reward name, a payload too large for it, a reward that crashed, a restart, "
                "or more than its pending-task limit; look for the uuid in the service log")


@dataclass
class CallStats:
    seconds: float = 0.0
    failed_attempts: int = 0
    polls: int = 0
    last_error: str = ""


@dataclass
class EnqueueReceipt:
    uuid: str
    replica_id: str | None
    nbytes: int
    stats: CallStats = field(default_factory=CallStats)


@dataclass
class PullReceipt:
    uuid: str
    reward_name: str
    scores: dict[str, list]
    stats: CallStats = field(default_factory=CallStats)


class RemoteRewardClient:
    def __init__(self, config: RemoteConfig, *, rng: random.Random | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._local = threading.local()  # one requests.Session per thread: sessions are not thread-safe

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _headers(self, replica_id: str | None = None) -> dict:
        headers = {}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        if replica_id:
            headers[protocol.REPLICA_HEADER] = replica_id
        return headers

    def _post(self, url: str, what: str, *, data, headers: dict, read_timeout: float,
              deadline: Deadline, parse: Callable[[bytes], Any], not_ready_400: bool = False):
        cfg, stats, start = self.config, CallStats(), time.monotonic()
        while True:
            remaining = deadline.remaining()
            if remaining <= 0:
                raise RewardUnavailableError(
                    f"{what}: no result within the {deadline.budget_s:g} s budget "
                    f"({stats.failed_attempts} failed attempts, {stats.polls} not-ready polls; "
                    f"last error: {stats.last_error or 'none'})"
                    + (DROPPED_HINT if not_ready_400 and stats.polls else "")
                    + "; the budget is the remote reward key budget_s")
            timeout = (max(1e-3, min(cfg.connect_timeout_s, remaining)),
                       max(1e-3, min(read_timeout, remaining)))
            retry_after = None
            try:
                resp = self._session().post(url, data=data, headers=headers, timeout=timeout)
            except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema,
                    requests.exceptions.InvalidURL) as exc:
                raise RewardConfigError(f"{what}: bad URL {url!r}: {exc}") from None
            except requests.Timeout:
                stats.last_error = f"timed out after {timeout[1]:.3g} s"
            except requests.RequestException as exc:  # refused, reset, truncated answer ...
                stats.last_error = f"connection failed: {type(exc).__name__}"
            else:
                code = resp.status_code
                if code == 200:
                    try:
                        parsed = parse(resp.content)
                        stats.seconds = time.monotonic() - start
                        return parsed, stats
                    except RewardProtocolError as exc:
                        stats.last_error = str(exc)
                elif code == 400 and not_ready_400:
                    self._wait(poll_delay(stats.polls, cfg.poll_initial_s, cfg.poll_max_s), deadline)
                    stats.polls += 1
                    continue
                elif code in RETRYABLE_STATUS:
                    stats.last_error = f"HTTP {code}: {resp.text[:200]}"
                    retry_after = _retry_after(resp)
                else:
                    raise RewardServiceError(_final_message(what, url, code, resp.text), status=code)
            stats.failed_attempts += 1
            if stats.failed_attempts >= cfg.max_attempts:
                raise RewardUnavailableError(
                    f"{what}: gave up after {stats.failed_attempts} failed attempts; "
                    f"last error: {stats.last_error}")
            delay = backoff_delay(stats.failed_attempts - 1, cfg.backoff_initial_s, cfg.backoff_max_s,
                                  cfg.backoff_jitter, self._rng)
            if retry_after is not None:
                delay = max(delay, min(retry_after, cfg.backoff_max_s))
            self._wait(delay, deadline)

    def _wait(self, seconds: float, deadline: Deadline) -> None:
        self._sleep(max(0.0, min(seconds, deadline.remaining())))

    def ping(self, info: Mapping[str, Any] | None = None, deadline: Deadline | None = None) -> dict:
        deadline = deadline or Deadline(self.config.budget_s)
        url = self.config.ping_endpoint()
        body, _ = self._post(url, f"ping {url}", data={"info_data": json.dumps(dict(info or {}))},
                             headers=self._headers(), read_timeout=self.config.pull_timeout_s,
                             deadline=deadline, parse=_loose_json)
        return body

    def enqueue_body(self, body: bytes, what: str, deadline: Deadline) -> EnqueueReceipt:
        headers = self._headers()
        headers["Content-Type"] = "application/octet-stream"
        (uuid, replica), stats = self._post(
            self.config.enqueue_url, what, data=body, headers=headers,
            read_timeout=self.config.enqueue_read_timeout(len(body)), deadline=deadline,
            parse=protocol.parse_enqueue_response)
        return EnqueueReceipt(uuid, replica, len(body), stats)

    def enqueue(self, media: np.ndarray, prompts, reward_weights: Mapping[str, float], *,
                media_type: str | None = None, extras: Mapping[str, Any] | None = None,
                deadline: Deadline | None = None) -> EnqueueReceipt:
        media = np.asarray(media)
        media_type = media_type or protocol.infer_media_type(media)
        protocol.check_media(media, media_type)
        header = protocol.build_header(prompts, reward_weights, media_type, extras)
        body = protocol.encode_enqueue(header, media)
        return self.enqueue_body(body, f"enqueue of {sorted(reward_weights)} to {self.config.enqueue_url}",
                                 deadline or Deadline(self.config.budget_s))

    def enqueue_text(self, completions, prompts, references, reward_weights: Mapping[str, float], *,
                     extras: Mapping[str, Any] | None = None,
                     deadline: Deadline | None = None) -> EnqueueReceipt:
        """Text completions (a language model's answers) and their reference answers, as
        media_type "text" (wfm_jax's extension of the protocol, see protocol.py); pull as for images."""
        completions = protocol.text_media(completions)
        references = [str(r) for r in references]
        if len(references) != completions.shape[0]:
            raise RewardProtocolError(f"{len(references)} references for {completions.shape[0]} completions")
        if "references" in (extras or {}):
            raise RewardProtocolError("pass the references as the references argument, not in extras")
        return self.enqueue(completions, prompts, reward_weights, media_type="text",
                            extras={**(extras or {}), "references": references}, deadline=deadline)

    def pull(self, uuid: str, reward_name: str, *, replica_id: str | None = None,
             deadline: Deadline | None = None) -> PullReceipt:
        scores, stats = self._post(
            self.config.fetch_url, f"pull of reward {reward_name!r} for uuid {uuid}",
            data={"uuid": uuid, "type": reward_name}, headers=self._headers(replica_id),
            read_timeout=self.config.pull_timeout_s, deadline=deadline or Deadline(self.config.budget_s),
            parse=lambda content: protocol.parse_pull_response(content, reward_name, uuid),
            not_ready_400=True)
        return PullReceipt(uuid, reward_name, scores, stats)


def _loose_json(content: bytes) -> dict:
    try:
        obj = json.loads(content.decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"raw": content[:200].decode("utf-8", "replace")}
    return obj if isinstance(obj, dict) else {"raw": obj}


def _retry_after(resp: requests.Response) -> float | None:
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None


def _final_message(what: str, url: str, code: int, text: str) -> str:
    detail = text[:300].strip()
    if code in (401, 403):
        return (f"{what}: {url} rejected the token (HTTP {code}); set REMOTE_REWARD_TOKEN or the "
                f"'token' key to the service's token")
    if code == 413:
        return f"{what}: {url} refused the payload as too large (HTTP 413): {detail}"
    if code == 404:
        return f"{what}: {url} answered 404 (unknown endpoint, or uuid unknown/expired): {detail}"
    return f"{what}: {url} answered HTTP {code}: {detail}"
