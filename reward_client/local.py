"""In-process rewards: JPEG (in)compressibility and the media adapter every local reward goes through.

Video batches uint8 [B,C,T,H,W]: rewards registered with ``video="frames"`` are called on up to
``max_video_frames`` evenly spaced frames (first and last included), one call per frame with that
frame of every video, and the B scores are averaged over those frames.
"""
from __future__ import annotations

import io
from typing import Any, Mapping

import numpy as np
from PIL import Image

from reward_client.errors import RewardValueError
from reward_client.registry import get_reward, register_reward

JPEG_QUALITY = 95
JPEG_KB_SCALE = 500.0  # flow_grpo/DDPO style: kilobytes / 500


def _pil(image: np.ndarray) -> Image.Image:
    if image.shape[-1] == 1:
        return Image.fromarray(np.ascontiguousarray(image[..., 0]))
    if image.shape[-1] == 3:
        return Image.fromarray(np.ascontiguousarray(image))
    raise RewardValueError(f"image of shape {image.shape}: expected 1 or 3 channels last")


def jpeg_kilobytes(images: np.ndarray, quality: int = JPEG_QUALITY) -> np.ndarray:
    """Size in kB (1000 bytes) of each image saved as JPEG at ``quality`` by PIL."""
    sizes = []
    for image in np.asarray(images, dtype=np.uint8):
        buf = io.BytesIO()
        _pil(image).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return np.asarray(sizes, dtype=np.float64)


@register_reward("jpeg_compressibility")
def jpeg_compressibility(images, prompts, extras):
    """Higher for images that compress well: -kB / 500."""
    return -jpeg_kilobytes(images) / JPEG_KB_SCALE


@register_reward("jpeg_incompressibility")
def jpeg_incompressibility(images, prompts, extras):
    """Higher for images that compress badly: +kB / 500."""
    return jpeg_kilobytes(images) / JPEG_KB_SCALE


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
    """Run local reward ``name`` on an image or video batch -> {score_key: float64 [B]}."""
    reward = get_reward(name)
    extras = dict(extras or {})
    batch = media.shape[0]
    if len(prompts) != batch:
        raise RewardValueError(f"local reward {name!r}: {len(prompts)} prompts for a batch of {batch}")
    if media_type == "image" or reward.video == "native":
        return _as_scores(name, reward.fn(media, list(prompts), extras), batch)
    if media_type != "video":
        raise RewardValueError(f"local reward {name!r} cannot score media_type {media_type!r}")
    per_frame = []
    for t in frame_indices(media.shape[2], max_video_frames):
        frames = np.ascontiguousarray(np.moveaxis(media[:, :, t], 1, -1))  # [B,C,H,W] -> [B,H,W,C]
        per_frame.append(_as_scores(name, reward.fn(frames, list(prompts), extras), batch))
    return {key: np.mean([f[key] for f in per_frame], axis=0) for key in per_frame[0]}
