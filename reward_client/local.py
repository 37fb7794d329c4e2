"""In-process rewards: JPEG (in)compressibility and the media adapter every local reward goes through.

Video batches uint8 [B,C,T,H,W]: rewards registered with ``video="frames"`` are called on up to
``max_video_frames`` evenly spaced frames (first and last included), one call per frame with that
frame of every video, and the B scores are averaged over those frames.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from reward_client.errors import RewardValueError
from reward_client.registry import register_reward

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
