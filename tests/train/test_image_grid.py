"""The validation grid's captions: words stay apart (the FreeType default font drew 2-pixel
spaces that ran a prompt's words together) and each caption sits under its own image."""
from __future__ import annotations

import itertools

import numpy as np

from wfm_jax.train.image_grid import LINE_H, GridGeometry, captioned_grid


def _ink_runs(row_band: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of the column runs that hold any dark pixel."""
    dark = (row_band < 128).any(axis=0)
    runs, start = [], None
    for x, d in enumerate(dark):
        if d and start is None:
            start = x
        if not d and start is not None:
            runs.append((start, x))
            start = None
    return runs


def test_caption_words_are_separated_by_a_visible_space():
    images = np.full((1, 32, 32, 3), 200, np.uint8)
    grid = np.asarray(captioned_grid(images, ["ll ll"]).convert("L"))
    geo = GridGeometry.of(1, 32, 32, min_cell=128, caption_lines=3)
    band = grid[geo.cell_h + 2:geo.cell_h + 2 + LINE_H]
    runs = _ink_runs(band)
    gaps = [b0 - a1 for (_, a1), (b0, _) in itertools.pairwise(runs)]
    # the grid wraps captions at 6 pixels a character: a space must be about that wide (the
    # FreeType default's was 2 pixels, a 4-pixel gap that read as no space at all)
    assert len(runs) >= 2 and max(gaps) >= 5, (runs, gaps)


def test_each_caption_is_drawn_under_its_own_tile():
    images = np.full((2, 16, 16, 3), 200, np.uint8)
    grid = np.asarray(captioned_grid(images, ["x", ""]).convert("L"))
    geo = GridGeometry.of(2, 16, 16, min_cell=128, caption_lines=3)
    for i, expect_ink in enumerate([True, False]):
        x, y = geo.origin(i)
        band = grid[y + geo.cell_h:y + geo.cell_h + geo.text_h, x:x + geo.cell_w]
        assert bool((band < 128).any()) == expect_ink
