"""Image and video decoding with the SFT transform: resize the shorter side, centre-crop.

Layout: an image is uint8 (H, W, C) RGB; a video window is uint8 (T, H, W, C) RGB. They stay uint8
up to the device (a quarter of float32's bytes in worker IPC and host-to-device copies); the VAE
encoder's jit maps them to [-1, 1] with to_signed_unit's float32 formula. Resizing is PIL
bilinear (antialiased when shrinking) to the smallest size covering (H, W); the crop offsets are
round((w - W) / 2), round((h - H) / 2).
Videos are decoded with OpenCV's FFmpeg backend (opencv-python); PIL cannot read mp4.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from wfm_jax.data.errors import BadSample, DataError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp")
VIDEO_EXTS = (".mp4",)


def resize_center_crop(image: Image.Image, size_hw: tuple[int, int]) -> Image.Image:
    """Scale so the image covers (H, W) (shorter side first), then cut the centre (H, W)."""
    height, width = size_hw
    w, h = image.size
    scale = max(height / h, width / w)
    new_w, new_h = max(width, round(w * scale)), max(height, round(h * scale))
    if (new_w, new_h) != (w, h):
        image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = round((new_w - width) / 2), round((new_h - height) / 2)
    return image.crop((left, top, left + width, top + height))


def to_signed_unit(pixels: np.ndarray) -> np.ndarray:
    """uint8 [0, 255] -> float32 [-1, 1] (x / 127.5 - 1)."""
    return pixels.astype(np.float32) / 127.5 - 1.0


# to_signed_unit of every uint8 value: the encoders' jits look pixels up here, so the device
# gives exactly numpy's float32 bits on any backend (no reliance on how XLA lowers the divide)
SIGNED_UNIT_TABLE = to_signed_unit(np.arange(256, dtype=np.uint8))


def load_image(path, size_hw: tuple[int, int], name: str | None = None) -> np.ndarray:
    """(H, W, 3) uint8 from a path or a binary file object (`name` for messages);
    a file PIL cannot decode is a BadSample naming it."""
    name = name or path
    try:
        with Image.open(path) as image:
            image.load()  # PIL decodes lazily: force it here so truncation is caught here
            rgb = image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as e:  # UnidentifiedImageError is an OSError
        raise BadSample(f"corrupt image {name}: {e}") from e
    return np.asarray(resize_center_crop(rgb, size_hw), np.uint8)


def _cv2():
    try:
        import cv2
    except ImportError as e:
        raise DataError("reading .mp4 needs OpenCV: pip install opencv-python-headless") from e
    return cv2


def _read_all(capture) -> list[np.ndarray]:
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            return frames
        frames.append(frame)


def load_video_window(path: str, size_hw: tuple[int, int], num_frames: int,
                      rng: np.random.Generator) -> np.ndarray:
    """A random window of `num_frames` consecutive frames -> (T, H, W, 3) uint8.
    A video that cannot be decoded, or is shorter than the window, is a BadSample naming it."""
    cv2 = _cv2()
    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise BadSample(f"corrupt video {path}: cannot be opened/decoded")
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        if count <= 0:  # container without a frame count: decode everything
            frames = _read_all(capture)
            count = len(frames)
        else:
            frames = None
        if count < num_frames:
            raise BadSample(f"video {path} has {count} frames, fewer than train_frames={num_frames}")
        start = int(rng.integers(0, count - num_frames + 1))
        if frames is not None:
            window = frames[start:start + num_frames]
        else:
            for _ in range(start):  # grab() decodes without converting: exact, unlike seeking
                if not capture.grab():
                    raise BadSample(f"corrupt video {path}: frame {start} of {count} unreadable")
            window = []
            for i in range(num_frames):
                ok, frame = capture.read()
                if not ok:
                    raise BadSample(f"corrupt video {path}: frame {start + i} of {count} unreadable")
                window.append(frame)
    finally:
        capture.release()
    out = [np.asarray(resize_center_crop(Image.fromarray(f[:, :, ::-1]), size_hw)) for f in window]
    return np.stack(out).astype(np.uint8, copy=False)


def load_image_bytes(data: bytes, size_hw: tuple[int, int], name: str) -> np.ndarray:
    import io
    return load_image(io.BytesIO(data), size_hw, name=name)


def load_video_bytes(data: bytes, size_hw: tuple[int, int], num_frames: int,
                     rng: np.random.Generator, name: str) -> np.ndarray:
    """load_video_window on in-memory mp4 bytes (a temp file in RAM where there is one: OpenCV
    opens videos by path); messages name `name`, not the temp file."""
    import os
    import tempfile
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.NamedTemporaryFile(suffix=".mp4", dir=shm) as f:
        f.write(data)
        f.flush()
        try:
            return load_video_window(f.name, size_hw, num_frames, rng)
        except BadSample as e:
            raise BadSample(str(e).replace(f.name, name)) from None
