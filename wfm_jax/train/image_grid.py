"""An image grid with a caption (prompt and reward) under each image, for validation logs."""
from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LINE_H = 12  # pixels per caption line (PIL's default bitmap font)


def captioned_grid(images: np.ndarray, captions: Sequence[str], *, min_cell: int = 128,
                   caption_lines: int = 3) -> Image.Image:
    """(B, H, W, 3) uint8 -> one PIL image, images upscaled to at least `min_cell` pixels wide
    (nearest: tiny test images stay legible) with each caption wrapped below its image."""
    b, h, w, _ = images.shape
    geo = GridGeometry.of(b, h, w, min_cell=min_cell, caption_lines=caption_lines)
    font = ImageFont.load_default_imagefont()  # the bitmap font: load_default() is a FreeType
    # face whose 2-pixel spaces ran the words of a caption together
    grid = Image.new("RGB", geo.size, "white")
    draw = ImageDraw.Draw(grid)
    chars = max(8, geo.cell_w // 6)
    for i in range(b):
        x, y = geo.origin(i)
        grid.paste(Image.fromarray(images[i]).resize((geo.cell_w, geo.cell_h), Image.NEAREST), (x, y))
        lines = textwrap.wrap(captions[i], chars)[:caption_lines]
        for j, line in enumerate(lines):
            draw.text((x + 2, y + geo.cell_h + 2 + j * LINE_H), line, fill="black", font=font)
    return grid


@dataclasses.dataclass(frozen=True)
class GridGeometry:
    """Where each tile of a captioned grid goes (shared by the image and the video grid)."""
    zoom: int
    cols: int
    rows: int
    cell_w: int
    cell_h: int
    text_h: int

    @classmethod
    def of(cls, b: int, h: int, w: int, *, min_cell: int = 128, caption_lines: int = 3):
        zoom = max(1, math.ceil(min_cell / w))
        cols = math.ceil(math.sqrt(b))
        return cls(zoom, cols, math.ceil(b / cols), w * zoom, h * zoom, caption_lines * LINE_H + 4)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the whole grid."""
        return self.cols * self.cell_w, self.rows * (self.cell_h + self.text_h)

    def origin(self, i: int) -> tuple[int, int]:
        """(x, y) of tile i's top-left corner; its caption sits below it."""
        r, c = divmod(i, self.cols)
        return c * self.cell_w, r * (self.cell_h + self.text_h)


def save_grid(grid: Image.Image, path: str) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp.png"
    grid.save(tmp, format="PNG")
    os.replace(tmp, path)
    return path
