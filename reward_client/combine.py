"""Reward function specs and the arithmetic that turns per-function scores into one reward.

Per function: ``s_i = sum of scores[k] for k in score_key.split("+")`` (the raw score, kept for
logging), ``c_i = clip_i(s_i) * weight_i`` (clip_i defaults to cosmos-rl's [-5, 5]); total
``= clip_total(sum_i c_i) * scale``.
``score_key`` defaults to the reward name, or to the single key a service returns
(the OCR service answers ``ocr_reward`` for reward ``ocr``).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from reward_client.errors import RewardConfigError, RewardValueError

Clip = tuple[float, float] | None


def parse_clip(value: Any, what: str) -> Clip:
    """None -> no clip; c -> (-c, c); [lo, hi] -> (lo, hi)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value > 0:
            raise RewardConfigError(f"{what}: clip {value!r} must be > 0 (or a [lo, hi] pair)")
        return (-float(value), float(value))
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise RewardConfigError(f"{what}: clip {value!r} must be a number, a [lo, hi] pair or None") from None
    if not lo < hi:
        raise RewardConfigError(f"{what}: clip [{lo}, {hi}] needs lo < hi")
    return (lo, hi)


# cosmos-rl clips every function's score to [clip_min, clip_max] = [-5, 5] before weighting;
# the same default here keeps a recipe's totals equal in both (clip: None turns it off).
DEFAULT_FN_CLIP = (-5.0, 5.0)


@dataclass(frozen=True)
class RewardFnSpec:
    name: str
    weight: float = 1.0
    score_key: str | None = None
    clip: Clip = DEFAULT_FN_CLIP
    local: bool | None = None  # None: local when no remote service is configured


SPEC_KEYS = tuple(f.name for f in fields(RewardFnSpec)) + ("clip_min", "clip_max")  # cosmos-rl's names


def _entry_clip(entry: Mapping[str, Any], name: str) -> Clip:
    """'clip' (wfm_jax: c, [lo, hi] or None) or cosmos-rl's 'clip_min' / 'clip_max', not both."""
    halves = [k for k in ("clip_min", "clip_max") if entry.get(k) is not None]
    if halves and entry.get("clip") is not None:
        raise RewardConfigError(f"reward {name!r}: give either 'clip' or 'clip_min'/'clip_max', not both")
    if halves:
        lo, hi = (entry.get(k) for k in ("clip_min", "clip_max"))
        return parse_clip([DEFAULT_FN_CLIP[0] if lo is None else lo,
                           DEFAULT_FN_CLIP[1] if hi is None else hi], f"reward {name!r}")
    return parse_clip(entry.get("clip", DEFAULT_FN_CLIP), f"reward {name!r}")


def parse_reward_fns(entries: Iterable[Any]) -> list[RewardFnSpec]:
    specs, seen = [], set()
    for i, entry in enumerate(entries):
        if isinstance(entry, RewardFnSpec):
            entry = dataclasses.asdict(entry)
        if hasattr(entry, "to_dict"):  # ml_collections.ConfigDict
            entry = entry.to_dict()
        if not isinstance(entry, Mapping):
            raise RewardConfigError(f"reward_fns[{i}] must be a mapping with at least 'name', got {entry!r}")
        unknown = [k for k in entry if k not in SPEC_KEYS]
        if unknown:
            hint = difflib.get_close_matches(unknown[0], SPEC_KEYS, n=1)
            raise RewardConfigError(f"reward_fns[{i}]: unknown key {unknown[0]!r}"
                                    + (f"; did you mean {hint[0]!r}?" if hint else f"; known: {SPEC_KEYS}"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise RewardConfigError(f"reward_fns[{i}] needs a non-empty string 'name'")
        if name in seen:
            raise RewardConfigError(f"reward_fns: reward {name!r} is listed twice")
        seen.add(name)
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise RewardConfigError(f"reward {name!r}: weight {weight!r} must be a finite number > 0 "
                                    "(services treat weight <= 0 as 'skip'; remove the entry instead)")
        score_key = entry.get("score_key")
        if score_key is not None and (not isinstance(score_key, str)
                                      or not all(k.strip() for k in score_key.split("+"))):
            raise RewardConfigError(f"reward {name!r}: score_key {score_key!r} must look like 'a' or 'a+b'")
        local = entry.get("local")
        if local is not None and not isinstance(local, bool):
            raise RewardConfigError(f"reward {name!r}: local must be true, false or None")
        specs.append(RewardFnSpec(name, float(weight), score_key, _entry_clip(entry, name), local))
    if not specs:
        raise RewardConfigError("reward_fns is empty: name at least one reward function")
    return specs


def score_keys(spec: RewardFnSpec, available: Iterable[str]) -> list[str]:
    available = list(available)
    if spec.score_key is not None:
        keys = [k.strip() for k in spec.score_key.split("+")]
    elif spec.name in available:
        keys = [spec.name]
    elif len(available) == 1:
        keys = available
    else:
        raise RewardValueError(f"reward {spec.name!r}: no score_key given and the answer has keys "
                               f"{sorted(available)}; set score_key to one of them (or 'a+b')")
    for key in keys:
        if key not in available:
            raise RewardValueError(f"reward {spec.name!r}: score key {key!r} is not in the answer; "
                                   f"available keys: {sorted(available)}")
    return keys


def keyed_scores(spec: RewardFnSpec, scores: Mapping[str, Any], batch: int) -> dict[str, np.ndarray]:
    """The selected keys as float64 [batch] arrays; null entries become NaN (caught as non-finite)."""
    out = {}
    for key in score_keys(spec, scores):
        values = scores[key]
        try:
            arr = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        except (TypeError, ValueError):
            raise RewardValueError(f"reward {spec.name!r}: score key {key!r} holds non-numeric values "
                                   f"(e.g. {list(values)[:2]!r})") from None
        if arr.shape != (batch,):
            raise RewardValueError(f"reward {spec.name!r}: score key {key!r} has {arr.size} values "
                                   f"for a batch of {batch}")
        out[key] = arr
    return out


def nonfinite(keyed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{key: sample indices holding NaN/inf}, only keys that have any."""
    bad = {k: np.flatnonzero(~np.isfinite(v)) for k, v in keyed.items()}
    return {k: v for k, v in bad.items() if v.size}


def _clip(x: np.ndarray, clip: Clip) -> np.ndarray:
    return x if clip is None else np.clip(x, clip[0], clip[1])


def combine_scores(specs: list[RewardFnSpec], raw: Mapping[str, np.ndarray], *,
                   total_clip: Clip = (-5.0, 5.0), scale: float = 1.0) -> np.ndarray:
    """total = clip_total(sum_i clip_i(raw_i) * w_i) * scale, as float32."""
    total = None
    for spec in specs:
        x = np.asarray(raw[spec.name], dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise RewardValueError(f"reward {spec.name!r}: non-finite scores at samples "
                                   f"{np.flatnonzero(~np.isfinite(x)).tolist()}")
        term = _clip(x, spec.clip) * spec.weight
        total = term if total is None else total + term
    return (_clip(total, total_clip) * scale).astype(np.float32)
