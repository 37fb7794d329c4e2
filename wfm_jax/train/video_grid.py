"""A video grid for validation logs: each sample a tile, all tiles' frames in lockstep, the
prompt and reward captioned under each tile (the layout of image_grid.captioned_grid)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from wfm_jax.io.media import to_uint8
from wfm_jax.train.image_grid import GridGeometry, captioned_grid


def captioned_video_grid(videos, captions: Sequence[str], *, min_cell: int = 128,
                         caption_lines: int = 3) -> np.ndarray:
    """(B, T, H, W, 3) in [0, 1] (or uint8) -> (T, GH, GW, 3) uint8 frames; GH and GW even
    (padded white), which every mp4 codec accepts."""
    videos = to_uint8(videos)
    if videos.ndim != 5 or videos.shape[-1] != 3:
        raise ValueError(f"videos must be (B, T, H, W, 3), got {videos.shape}")
    if len(captions) != videos.shape[0]:
        raise ValueError(f"{len(captions)} captions for {videos.shape[0]} videos")
    b, t, h, w, _ = videos.shape
    geo = GridGeometry.of(b, h, w, min_cell=min_cell, caption_lines=caption_lines)
    # the captions are drawn once; each frame only replaces the tiles
    canvas = np.asarray(captioned_grid(videos[:, 0], captions, min_cell=min_cell,
                                       caption_lines=caption_lines))
    gw, gh = geo.size
    out = np.full((t, gh + gh % 2, gw + gw % 2, 3), 255, np.uint8)
    out[:, :gh, :gw] = canvas
    tiles = videos.repeat(geo.zoom, axis=2).repeat(geo.zoom, axis=3)  # nearest, as the image grid
    for i in range(b):
        x, y = geo.origin(i)
        out[:, y:y + geo.cell_h, x:x + geo.cell_w] = tiles[i]
    return out
