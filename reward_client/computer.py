"""RewardComputer: the one interface a trainer uses for remote and local rewards.

    rc = RewardComputer.from_config({
        "reward_fns": [{"name": "pickscore", "weight": 1.0},
                       {"name": "ocr", "weight": 0.5, "score_key": "ocr_reward", "clip": 1.0},
                       {"name": "jpeg_compressibility", "weight": 0.1, "local": True}],
        "scale": 1.0, "clip": 5.0, "on_failure": "raise",   # or "drop"
        "remote": {"budget_s": 900},      # URLs/token from REMOTE_REWARD_* (or legacy WFM_REWARD_*)
    })
    rc.check_reachable()                  # at trainer start: ping the service, load local models
    handle = rc.submit(images_uint8, prompts, group_ids=prompt_ids)   # returns at once
    ...                                   # keep sampling; the worker enqueues and pulls meanwhile
    res = handle.result()                 # RewardResult (blocks only if not in yet)
    res.total     # float32 [B] = clip_total(sum_i clip_i(score_i) * weight_i) * scale
    res.per_fn    # {name: float64 [B]} raw score of each function (its score_key sum), for logging
    res.keep      # bool [B]; False only where on_failure="drop" dropped a prompt group
    res.dropped_groups, res.failures, res.uuids, res.timings   # timings: enqueue_s, pull_s, local_s, total_s
    rc.metrics()  # counters: batches, samples, enqueued, pulled, failed_pulls, failed_batches, dropped_*
    rc.close()    # waits for jobs -> {"uncollected": [...], "unaccounted": {uuid: [names]}}

``submit(media, prompts, *, group_ids=None, extras=None, media_type=None)``: media uint8 images
[B,H,W,C] or videos [B,C,T,H,W], or with media_type="latent" float VAE latents [B,C,T,h,w]
for the service to decode (remote rewards only; the config key ``media_type="latent"`` tells a
trainer to send those) (numpy or jax; copied/encoded at submit, so the caller may reuse
the buffer); ``extras`` go into the enqueue JSON header (e.g. ``video_infos``, GenEval metadata)
and to local rewards. A function runs locally when its spec says ``local: True``, or when
``local`` is unset, no service is configured and the name is a registered local reward; all remote
functions of a batch share one enqueue (one uuid), pulled once per name. Local rewards score
videos frame by frame (see reward_client/local.py).

Unobtainable rewards (no answer within ``budget_s``, a final service error such as 401/404/422, a
missing score key, NaN/inf scores): ``on_failure="raise"`` (default) makes ``result()`` raise a
RewardError naming reward, key, samples and uuid; ``on_failure="drop"`` drops every prompt group
touched by a failure (``group_ids`` are numbered within the batch, default each sample its own
group, so submit whole groups together): ``keep`` is False there, ``total`` and ``per_fn`` hold
NaN there (never an invented value) and ``dropped_groups`` counts them, as does ``metrics()``.
"""
from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reward_client import protocol
from reward_client.backoff import Deadline
from reward_client.catalog import available_rewards, get_reward, is_local, score_local
from reward_client.client import RemoteRewardClient
from reward_client.combine import (
    combine_scores,
    keyed_scores,
    nonfinite,
    parse_clip,
    parse_reward_fns,
    score_keys,
)
from reward_client.config import RemoteConfig, resolve_remote_config
from reward_client.errors import RewardConfigError, RewardError, RewardUnavailableError, RewardValueError
from reward_client.pipeline import Ledger, RewardHandle, RewardPipeline

FAILURE_POLICIES = ("raise", "drop")
CONFIG_KEYS = ("reward_fns", "scale", "clip", "on_failure", "max_inflight", "max_video_frames", "remote",
               "media_type")
# what a trainer sends: decoded pixels (image or video by ndim), or its VAE latents for the
# service to decode (cosmos-rl's video trainer sends float16 Wan2.1 latents)
TRAINER_MEDIA = ("pixels", "latent")


@dataclass
class RewardResult:
    total: np.ndarray
    per_fn: dict[str, np.ndarray]
    keep: np.ndarray
    dropped_groups: int = 0
    failures: list[str] = field(default_factory=list)
    uuids: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # every other numeric key a reward answered (e.g. shapes_alignment's colour, count), by key
    # (reward.key when two rewards answer the same key); NaN where a sample was dropped
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def extra_scores(specs, raw: Mapping[str, Mapping], batch: int, keep: np.ndarray) -> dict:
    """The keys each reward answered beyond its score keys (logging only: never in the total);
    keys that are not numeric per sample are left out."""
    found: dict[tuple[str, str], np.ndarray] = {}
    for spec in specs:
        answer = raw.get(spec.name)
        if not isinstance(answer, Mapping):
            continue
        try:
            used = set(score_keys(spec, answer))
        except RewardValueError:
            used = set()
        for key, values in answer.items():
            if key in used:
                continue
            try:
                arr = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
            except (TypeError, ValueError):
                continue
            if arr.shape == (batch,):
                found[(spec.name, key)] = np.where(keep, arr, np.nan)
    keys = [k for _, k in found]
    return {(key if keys.count(key) == 1 else f"{name}.{key}"): v for (name, key), v in found.items()}


class RewardComputer:
    def __init__(self, reward_fns, *, remote: RemoteConfig | None = None, scale: float = 1.0,
                 clip: Any = 5.0, on_failure: str = "raise", max_inflight: int = 2,
                 max_video_frames: int = 4, client: RemoteRewardClient | None = None,
                 media_type: str = "pixels"):
        self.specs = parse_reward_fns(reward_fns)
        self.total_clip = parse_clip(clip, "total reward")
        self.scale = float(scale)
        if on_failure not in FAILURE_POLICIES:
            raise RewardConfigError(f"on_failure={on_failure!r}: expected one of {FAILURE_POLICIES}")
        self.on_failure = on_failure
        self.max_video_frames = int(max_video_frames)
        self.remote = remote
        self.local_specs, self.remote_specs = [], []
        for spec in self.specs:
            local = spec.local if spec.local is not None else remote is None
            if local and (spec.local or is_local(spec.name)):
                get_reward(spec.name)  # unknown name -> error listing the local rewards
                self.local_specs.append(spec)
            elif remote is None:
                hint = difflib.get_close_matches(spec.name, available_rewards(), n=1)
                raise RewardConfigError(
                    f"reward {spec.name!r} is not a local reward"
                    + (f" (did you mean {hint[0]!r}?)" if hint else "")
                    + " and no reward service is configured: set "
                    "REMOTE_REWARD_ENQUEUE_URL and REMOTE_REWARD_FETCH_URL (or the remote config keys)"
                    + f"; local rewards: {available_rewards()}")
            else:
                self.remote_specs.append(spec)
        if media_type not in TRAINER_MEDIA:
            raise RewardConfigError(f"reward media_type={media_type!r}: expected one of {TRAINER_MEDIA}")
        if media_type == "latent" and self.local_specs:
            raise RewardConfigError(
                f"reward media_type='latent' sends VAE latents to the reward service, but "
                f"{[s.name for s in self.local_specs]} run locally on pixels: serve them remotely "
                f"(e.g. python -m reward_client.server --pipeline DIR) or use media_type 'pixels'")
        self.media_type = media_type
        self.client = client or (RemoteRewardClient(remote) if self.remote_specs else None)
        self.ledger = Ledger()
        self._pipeline = RewardPipeline(max_inflight)
        self._lock = threading.Lock()
        self._metrics = {"batches": 0, "samples": 0, "failed_batches": 0,
                         "dropped_groups": 0, "dropped_samples": 0}

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                    **overrides) -> RewardComputer:
        cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
        unknown = [k for k in cfg if k not in CONFIG_KEYS]
        if unknown:
            raise RewardConfigError(f"unknown reward config key {unknown[0]!r}; known: {CONFIG_KEYS}")
        if "reward_fns" not in cfg:
            raise RewardConfigError("reward config needs 'reward_fns'")
        remote = resolve_remote_config(cfg.pop("remote", None), environ)
        return cls(cfg.pop("reward_fns"), remote=remote, **cfg, **overrides)

    # -- start-up check -------------------------------------------------------------------------
    def check_reachable(self, budget_s: float = 30.0) -> dict:
        """Ping the service (and check it serves our reward names when it lists them); load every
        local reward's model. Raises a RewardError naming the URL or reward on failure."""
        info = {}
        if self.remote_specs:
            weights = {s.name: s.weight for s in self.remote_specs}
            info = self.client.ping({"reward_fn": weights}, Deadline(budget_s))
            served = info.get("rewards")
            if isinstance(served, list):
                missing = [n for n in weights if n not in served]
                if missing:
                    raise RewardConfigError(f"reward service {self.remote.enqueue_url} does not serve "
                                            f"{missing}; it serves {sorted(served)}")
        for spec in self.local_specs:
            reward = get_reward(spec.name)
            if reward.setup is not None:
                reward.setup()
        return info

    # -- submission -----------------------------------------------------------------------------
    def submit(self, media, prompts, *, group_ids=None, extras: Mapping[str, Any] | None = None,
               media_type: str | None = None) -> RewardHandle:
        media = np.asarray(media)
        media_type = media_type or protocol.infer_media_type(media)
        protocol.check_media(media, media_type)
        prompts = [str(p) for p in prompts]
        batch = media.shape[0]
        if len(prompts) != batch:
            raise RewardValueError(f"{len(prompts)} prompts for a batch of {batch}")
        groups = np.arange(batch) if group_ids is None else np.asarray(group_ids).reshape(-1)
        if groups.shape != (batch,):
            raise RewardValueError(f"group_ids has {groups.size} entries for a batch of {batch}")
        extras = dict(extras or {})
        body = None
        if self.remote_specs:  # encode now: the bytes are a snapshot the caller may overwrite after
            header = protocol.build_header(prompts, {s.name: s.weight for s in self.remote_specs},
                                           media_type, extras)
            body = protocol.encode_enqueue(header, media)
        local_media = media.copy() if self.local_specs else None
        with self._lock:
            self._metrics["batches"] += 1
            self._metrics["samples"] += batch
        return self._pipeline.start(
            lambda handle: self._job(handle, body, local_media, prompts, groups, extras, media_type), batch)

    def score(self, media, prompts, **kwargs) -> RewardResult:
        return self.submit(media, prompts, **kwargs).result()

    # -- the job (worker thread) ----------------------------------------------------------------
    def _fetch_remote(self, handle, body, raw, failed, timings):
        names = [s.name for s in self.remote_specs]
        deadline = Deadline(self.remote.budget_s)
        t0 = time.monotonic()
        try:
            receipt = self.client.enqueue_body(body, f"enqueue of {names} to {self.remote.enqueue_url}",
                                               deadline)
        except RewardError as exc:
            for name in names:
                failed[name] = exc
            return
        timings["enqueue_s"] = time.monotonic() - t0
        handle.uuids.append(receipt.uuid)
        self.ledger.enqueued(receipt.uuid, names)
        for name in names:  # pull every name even after a failure, so each one is settled
            try:
                raw[name] = self.client.pull(receipt.uuid, name, replica_id=receipt.replica_id,
                                             deadline=deadline).scores
                self.ledger.settle(receipt.uuid, name, ok=True)
            except Exception as exc:  # whatever happens, this uuid/name is settled and reported
                failed[name] = exc if isinstance(exc, RewardError) else RewardUnavailableError(
                    f"pull of reward {name!r} for uuid {receipt.uuid} failed: {type(exc).__name__}: {exc}")
                self.ledger.settle(receipt.uuid, name, ok=False)
        timings["pull_s"] = time.monotonic() - t0 - timings["enqueue_s"]

    def _job(self, handle, body, media, prompts, groups, extras, media_type) -> RewardResult:
        t0 = time.monotonic()
        batch = len(prompts)
        raw: dict[str, Mapping] = {}
        failed: dict[str, Exception] = {}
        timings: dict[str, float] = {}
        if self.remote_specs:
            self._fetch_remote(handle, body, raw, failed, timings)
        t_local = time.monotonic()
        for spec in self.local_specs:
            try:
                raw[spec.name] = score_local(spec.name, media, prompts, media_type=media_type,
                                             extras=extras, max_video_frames=self.max_video_frames)
            except Exception as exc:  # a user's reward may raise anything; report it by name
                failed[spec.name] = RewardUnavailableError(
                    f"local reward {spec.name!r} failed: {type(exc).__name__}: {exc}")
                failed[spec.name].__cause__ = exc
        if self.local_specs:
            timings["local_s"] = time.monotonic() - t_local
        tag = f" (uuid {handle.uuids[0]})" if handle.uuids else ""
        per_fn, bad = {}, np.zeros(batch, bool)
        for spec in self.specs:
            if spec.name in failed:
                bad[:] = True
                continue
            try:
                keyed = keyed_scores(spec, raw[spec.name], batch)
            except RewardValueError as exc:
                failed[spec.name] = RewardValueError(f"{exc}{tag}")
                bad[:] = True
                continue
            bad_keys = nonfinite(keyed)
            if bad_keys:
                detail = ", ".join(f"key {k!r}: NaN/inf scores at samples {i.tolist()}" for k, i in bad_keys.items())
                failed[spec.name] = RewardValueError(f"reward {spec.name!r} {detail}{tag}")
                for idx in bad_keys.values():
                    bad[idx] = True
            per_fn[spec.name] = sum(keyed.values())
        timings["total_s"] = time.monotonic() - t0
        messages = [str(e) for e in failed.values()]
        if failed:
            with self._lock:
                self._metrics["failed_batches"] += 1
            if self.on_failure == "raise":
                kinds = {type(e) for e in failed.values()}
                cls = kinds.pop() if len(kinds) == 1 else RewardUnavailableError
                raise cls("rewards unobtainable for this batch: " + " | ".join(messages)) \
                    from next(iter(failed.values()))
        keep = ~np.isin(groups, groups[bad])
        total = np.full(batch, np.nan, np.float32)
        if keep.any():
            total[keep] = combine_scores(self.specs, {n: v[keep] for n, v in per_fn.items()},
                                         total_clip=self.total_clip, scale=self.scale)
        per_fn_out = {}
        for spec in self.specs:
            values = np.full(batch, np.nan)
            if spec.name in per_fn:
                values[keep] = per_fn[spec.name][keep]
            per_fn_out[spec.name] = values
        dropped_groups = int(np.unique(groups[~keep]).size)
        with self._lock:
            self._metrics["dropped_groups"] += dropped_groups
            self._metrics["dropped_samples"] += int((~keep).sum())
        extra = extra_scores(self.specs, raw, batch, keep)
        return RewardResult(total, per_fn_out, keep, dropped_groups, messages, list(handle.uuids),
                            timings, extra)

    # -- accounting -----------------------------------------------------------------------------
    def metrics(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._metrics)
        out.update(self.ledger.counts)
        return out

    def close(self) -> dict:
        """Wait for running jobs; -> {"uncollected": [...], "unaccounted": {uuid: [names]}} (both
        empty in a clean run; anything listed is also logged)."""
        uncollected = self._pipeline.close()
        return {"uncollected": uncollected, "unaccounted": self.ledger.unaccounted()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
