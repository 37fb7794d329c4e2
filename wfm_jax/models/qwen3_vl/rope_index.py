"""Host-side (numpy) multimodal position ids: transformers' `Qwen3VLModel.get_rope_index` and the
4-row `position_ids` its `generate` feeds the model.

Per sample, over the unpadded tokens in runs of one modality (mm_token_type_ids: 0 text, 1 image,
2 video): text tokens take (p, p, p) for consecutive p; a visual run takes the next grid of its
kind, (t, h, w) -> (h/m) x (w/m) tokens at (p, p + row, p + col), and p advances by
max(h, w) / m. Videos are first split per temporal patch (each frame group carries its own
timestamp text in the prompt). rope_delta = max position + 1 - number of unpadded tokens.
"""
from __future__ import annotations

import itertools

import numpy as np


def mm_token_type_ids(input_ids, image_token_id: int, video_token_id: int) -> np.ndarray:
    """0 text, 1 image pad, 2 video pad: what the processor returns beside input_ids."""
    ids = np.asarray(input_ids)
    return np.where(ids == image_token_id, 1, np.where(ids == video_token_id, 2, 0)).astype(np.int64)


def _grids(grid_thw, split_frames: bool) -> list[tuple[int, int, int]]:
    if grid_thw is None:
        return []
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3).tolist()
    if split_frames:
        grid = [(1, h, w) for t, h, w in grid for _ in range(t)]
    return [tuple(g) for g in grid]


def get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None,
                   attention_mask=None, *, spatial_merge_size: int = 2
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Returns position ids (3, B, L) int64 (0 at padding) and rope deltas (B, 1)."""
    ids = np.asarray(input_ids)
    types = np.asarray(mm_token_type_ids)
    b, n = ids.shape
    mask = np.ones((b, n), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids = {1: iter(_grids(image_grid_thw, False)), 2: iter(_grids(video_grid_thw, True))}
    out = np.zeros((3, b, n), np.int64)
    deltas = np.zeros((b, 1), np.int64)
    m = spatial_merge_size
    for i in range(b):
        kinds = types[i][mask[i]]
        pos, parts = 0, []
        for kind, run in itertools.groupby(kinds.tolist()):
            length = len(list(run))
            if kind == 0:
                parts.append(np.broadcast_to(pos + np.arange(length), (3, length)))
                pos += length
                continue
            try:
                _, h, w = next(grids[kind])
            except StopIteration:
                raise ValueError(f"sample {i} has more {'image' if kind == 1 else 'video'} runs "
                                 f"than grids") from None
            gh, gw = h // m, w // m
            if gh * gw != length:
                raise ValueError(f"sample {i}: a run of {length} visual tokens does not match its "
                                 f"grid ({h}, {w}) -> {gh * gw} tokens")
            r, c = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            parts.append(np.stack([np.full(gh * gw, pos), pos + r.reshape(-1), pos + c.reshape(-1)]))
            pos += max(gh, gw)
        if parts:
            pos_ids = np.concatenate(parts, axis=1)
            out[:, i, mask[i]] = pos_ids
            deltas[i, 0] = pos_ids.max() + 1 - len(kinds)
    for kind, it in grids.items():
        if next(it, None) is not None:
            raise ValueError(f"more {'image' if kind == 1 else 'video'} grids than visual runs")
    return out, deltas


def text_positions(attention_mask) -> np.ndarray:
    """(B, L): attention-mask cumsum - 1, 0 at padding (transformers' generation positions)."""
    mask = np.asarray(attention_mask).astype(np.int64)
    return np.where(mask == 0, 0, np.cumsum(mask, axis=-1) - 1)


def position_ids(input_ids, attention_mask=None, *, image_grid_thw=None, video_grid_thw=None,
                 image_token_id: int, video_token_id: int, spatial_merge_size: int = 2
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The (4, B, L) position ids `generate` builds (row 0 text positions, rows 1-3 M-RoPE) and
    the rope deltas (B, 1); without grids rows 1-3 equal row 0 and the deltas are 0."""
    ids = np.asarray(input_ids)
    mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    text = text_positions(mask)
    if image_grid_thw is None and video_grid_thw is None:
        return np.broadcast_to(text, (4, *text.shape)).copy(), np.zeros((ids.shape[0], 1), np.int64)
    types = mm_token_type_ids(ids, image_token_id, video_token_id)
    rope, deltas = get_rope_index(ids, types, image_grid_thw, video_grid_thw, mask,
                                  spatial_merge_size=spatial_merge_size)
    return np.concatenate([text[None], rope], axis=0), deltas
