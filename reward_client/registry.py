"""Registry of in-process reward functions.

A reward function takes ``(images, prompts, extras)``: uint8 images [N,H,W,C] (RGB), N prompt
strings and the request's extras dict, and returns N scores (array or list) or a dict
``{score_key: N scores}``. Adding one takes a few lines::

    from reward_client import register_reward

    @register_reward("brightness")
    def brightness(images, prompts, extras):
        return images.mean(axis=(1, 2, 3)) / 255.0

``video="frames"`` (default): for video batches the function is called once per sampled frame
with that frame of every video, and the per-frame scores are averaged. ``video="native"``: the
function receives the uint8 [B,C,T,H,W] batch itself.

``media="text"``: the function scores text completions (a language model's answers) instead of
pixels: it is called as ``fn(completions, prompts, extras)`` with N completion strings, and the
reference answers travel in ``extras["references"]`` (reward_client/reason.py has cosmos-rl's).
"""
from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from typing import Any, Callable

from reward_client.errors import RewardConfigError

RewardFn = Callable[[Any, list, dict], Any]
VIDEO_MODES = ("frames", "native")
MEDIA_KINDS = ("pixels", "text")  # what a local reward scores: images/videos, or text completions


@dataclass(frozen=True)
class LocalReward:
    name: str
    fn: RewardFn
    video: str = "frames"
    setup: Callable[[], None] | None = None  # loads weights etc.; called by check_reachable
    media: str = "pixels"


_REGISTRY: dict[str, LocalReward] = {}
_LOCK = threading.Lock()


def register_reward(name: str, *, video: str = "frames", setup: Callable[[], None] | None = None,
                    replace: bool = False, media: str = "pixels"):
    """Decorator registering ``fn`` as local reward ``name``; returns ``fn`` unchanged."""
    if video not in VIDEO_MODES:
        raise RewardConfigError(f"register_reward({name!r}): video={video!r}, expected one of {VIDEO_MODES}")
    if media not in MEDIA_KINDS:
        raise RewardConfigError(f"register_reward({name!r}): media={media!r}, expected one of {MEDIA_KINDS}")

    def decorate(fn: RewardFn) -> RewardFn:
        with _LOCK:
            if name in _REGISTRY and not replace and _REGISTRY[name].fn is not fn:
                raise RewardConfigError(f"local reward {name!r} is already registered "
                                        "(pass replace=True to override it)")
            _REGISTRY[name] = LocalReward(name, fn, video, setup, media)
        return fn

    return decorate


def unregister_reward(name: str) -> None:
    with _LOCK:
        _REGISTRY.pop(name, None)


def registered() -> dict[str, LocalReward]:
    """A snapshot of what is registered now (the built-ins join through reward_client.catalog)."""
    with _LOCK:
        return dict(_REGISTRY)


def lookup(name: str, known: dict[str, LocalReward]) -> LocalReward:
    """`known[name]`, or a RewardConfigError with the nearest name and the known ones."""
    try:
        return known[name]
    except KeyError:
        hint = difflib.get_close_matches(name, list(known), n=1)
        raise RewardConfigError(f"no local reward named {name!r}"
                                + (f"; did you mean {hint[0]!r}?" if hint else "")
                                + f" (local rewards: {sorted(known)})") from None
