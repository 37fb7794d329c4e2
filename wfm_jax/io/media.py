"""Writing what a run produces: mp4 clips (generate, validation) and PNG images, atomically.

A clip is frames (T, H, W, 3) RGB, float in [0, 1] (diffusers output_type="np") or uint8. mp4 is
written with OpenCV's FFmpeg backend ("mp4v"), which every opencv-python wheel carries; the file
appears under its name only when complete.
"""
from __future__ import annotations

import os

import numpy as np


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """[0, 1] floats -> uint8 with diffusers' rounding (numpy_to_pil: round(x * 255)); uint8 as is."""
    pixels = np.asarray(pixels)
    if pixels.dtype == np.uint8:
        return pixels
    return np.round(np.clip(pixels, 0.0, 1.0) * 255).astype(np.uint8)


def _parent(path: str) -> None:
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)


def write_mp4(path: str, frames: np.ndarray, fps: float = 16.0) -> str:
    """frames (T, H, W, 3) RGB -> `path` (.mp4); raises ValueError (one line) on bad input."""
    frames = to_uint8(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] < 1:
        raise ValueError(f"a clip must be frames (T, H, W, 3) with T >= 1, got {frames.shape}")
    try:
        import cv2
    except ImportError as e:
        raise ValueError("writing .mp4 needs OpenCV: pip install opencv-python-headless") from e
    _parent(path)
    tmp = f"{path}.tmp-{os.getpid()}.mp4"
    t, h, w, _ = frames.shape
    writer = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (w, h))
    if not writer.isOpened():
        raise ValueError(f"OpenCV cannot write an mp4 of {w}x{h} to {path}")
    try:
        for frame in frames:
            writer.write(np.ascontiguousarray(frame[..., ::-1]))  # OpenCV wants BGR
    finally:
        writer.release()
    os.replace(tmp, path)
    return path


def write_png(path: str, image: np.ndarray) -> str:
    """image (H, W, 3) in [0, 1] or uint8 -> `path` (.png), atomically."""
    from PIL import Image
    _parent(path)
    tmp = f"{path}.tmp-{os.getpid()}.png"
    Image.fromarray(to_uint8(image)).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path
