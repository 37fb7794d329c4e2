"""The local rewards by name: the built-in providers (jpeg, ocr, shapes_alignment, and the text
rewards of cosmos-rl's language-model post-training: format, single_choice, boxed_math) plus whatever
a user registered with `register_reward`. The providers register themselves into
reward_client.registry when imported; this module imports them, so the registry itself stays
free of providers (no import cycle between a provider and the table it fills)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import reward_client.local
import reward_client.ocr
import reward_client.reason
import reward_client.shapes  # (shapes_alignment)
import reward_client.vqa  # noqa: F401  (vqa_look)
from reward_client.errors import RewardValueError
from reward_client.registry import LocalReward, lookup, registered


def available_rewards() -> list[str]:
    return sorted(registered())


def get_reward(name: str) -> LocalReward:
    return lookup(name, registered())


def is_local(name: str) -> bool:
    return name in registered()


def frame_indices(num_frames: int, max_frames: int) -> np.ndarray:
    if num_frames <= max_frames:
        return np.arange(num_frames)
    return np.unique(np.linspace(0, num_frames - 1, max_frames).round().astype(int))


def _as_scores(name: str, out: Any, batch: int) -> dict[str, np.ndarray]:
    out = dict(out) if isinstance(out, Mapping) else {name: out}
    scores = {}
    for key, values in out.items():
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        if arr.shape != (batch,):
            raise RewardValueError(f"local reward {name!r} returned {arr.size} values for key {key!r} "
                                   f"on a batch of {batch}")
        scores[key] = arr
    return scores


def score_local(name: str, media: np.ndarray, prompts: list[str], *, media_type: str = "image",
                extras: Mapping[str, Any] | None = None, max_video_frames: int = 4) -> dict[str, np.ndarray]:
    """Run local reward ``name`` on an image or video batch, or on text completions (media_type
    "text", media a 1-D str array) -> {score_key: float64 [B]}."""
    reward = get_reward(name)
    extras = dict(extras or {})
    batch = media.shape[0]
    if len(prompts) != batch:
        raise RewardValueError(f"local reward {name!r}: {len(prompts)} prompts for a batch of {batch}")
    if (media_type == "text") != (reward.media == "text"):
        want = "text completions (media_type 'text')" if reward.media == "text" else "images or videos"
        raise RewardValueError(f"local reward {name!r} scores {want}, got media_type {media_type!r}")
    if media_type == "text":
        return _as_scores(name, reward.fn([str(c) for c in media], list(prompts), extras), batch)
    if media_type == "image" or reward.video == "native":
        return _as_scores(name, reward.fn(media, list(prompts), extras), batch)
    if media_type != "video":
        raise RewardValueError(f"local reward {name!r} cannot score media_type {media_type!r}")
    per_frame = []
    for t in frame_indices(media.shape[2], max_video_frames):
        frames = np.ascontiguousarray(np.moveaxis(media[:, :, t], 1, -1))  # [B,C,H,W] -> [B,H,W,C]
        per_frame.append(_as_scores(name, reward.fn(frames, list(prompts), extras), batch))
    return {key: np.mean([f[key] for f in per_frame], axis=0) for key in per_frame[0]}
