"""An image grid with a caption (prompt and reward) under each image, for validation logs."""
from __future__ import annotations

import math
import os
import textwrap
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def to_uint8(images) -> np.ndarray:
    """Float pixels in [0, 1] -> uint8 (rounded like diffusers' numpy_to_pil)."""
    return np.round(np.clip(np.asarray(images, np.float32), 0.0, 1.0) * 255).astype(np.uint8)


def captioned_grid(images: np.ndarray, captions: Sequence[str], *, min_cell: int = 128,
                   caption_lines: int = 3) -> Image.Image:
    """(B, H, W, 3) uint8 -> one PIL image, images upscaled to at least `min_cell` pixels wide
    (nearest: tiny test images stay legible) with each caption wrapped below its image."""
    b, h, w, _ = images.shape
    zoom = max(1, math.ceil(min_cell / w))
    cw, ch = w * zoom, h * zoom
    font = ImageFont.load_default()
    line_h = 12
    text_h = caption_lines * line_h + 4
    cols = math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = Image.new("RGB", (cols * cw, rows * (ch + text_h)), "white")
    draw = ImageDraw.Draw(grid)
    chars = max(8, cw // 6)
    for i in range(b):
        r, c = divmod(i, cols)
        x, y = c * cw, r * (ch + text_h)
        grid.paste(Image.fromarray(images[i]).resize((cw, ch), Image.NEAREST), (x, y))
        lines = textwrap.wrap(captions[i], chars)[:caption_lines]
        for j, line in enumerate(lines):
            draw.text((x + 2, y + ch + 2 + j * line_h), line, fill="black", font=font)
    return grid


def save_grid(grid: Image.Image, path: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp.png"
    grid.save(tmp, format="PNG")
    os.replace(tmp, path)
    return path
