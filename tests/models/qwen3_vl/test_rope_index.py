"""M-RoPE position ids: the numpy port vs transformers' `Qwen3VLModel.get_rope_index` on mixed,
left-padded batches, and the worked example of specs/reason2.md §1.3."""
from __future__ import annotations

import numpy as np
import pytest

from tests.models.qwen3_vl._oracle import IMAGE, TINY, VIDEO, left_pad, visual_run
from wfm_jax.models.qwen3_vl.rope_index import get_rope_index, mm_token_type_ids, position_ids

torch = pytest.importorskip("torch")


def _reference(ids, mask, grid, vgrid):
    from transformers import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    # get_rope_index reads only the config: no weights needed
    model = Qwen3VLModel.__new__(Qwen3VLModel)
    model.config = Qwen3VLConfig(**TINY)
    def t(a):
        return None if a is None else torch.tensor(np.asarray(a))
    pos, deltas = Qwen3VLModel.get_rope_index(
        model, t(ids), t(mm_token_type_ids(ids, IMAGE, VIDEO)), t(grid), t(vgrid), t(mask))
    return pos.numpy(), deltas.numpy()


def test_worked_example():
    ids = np.array([[10, 11, 12, 3, *[IMAGE] * 9, 4, 13, 14]])
    pos, deltas = get_rope_index(ids, mm_token_type_ids(ids, IMAGE, VIDEO), [[1, 6, 6]])
    t, h, w = pos[:, 0]
    np.testing.assert_array_equal(t, [0, 1, 2, 3, *[4] * 9, 7, 8, 9])
    np.testing.assert_array_equal(h[4:13], [4, 4, 4, 5, 5, 5, 6, 6, 6])
    np.testing.assert_array_equal(w[4:13], [4, 5, 6, 4, 5, 6, 4, 5, 6])
    assert deltas[0, 0] == -6


@pytest.mark.parametrize("case", ["images", "video", "mixed"])
def test_matches_transformers(case):
    grid, vgrid = [[1, 4, 6], [1, 6, 4], [1, 8, 8]], [[3, 4, 4], [2, 6, 8]]
    img = [visual_run(IMAGE, g) for g in grid]
    vid = [visual_run(VIDEO, g) for g in vgrid]
    rows = {
        "images": ([[1, *img[0], 9, *img[1]], [1, 2, *img[2], 8, 9, 10, 11]], grid, None),
        "video": ([[1, *vid[0], 7], [15, 16, *vid[1], 9, 9]], None, vgrid),
        "mixed": ([[1, *img[0], 9, *vid[0], 7, 7], [1, 2, 3], [*img[1], *vid[1], *img[2]]], grid, vgrid),
    }[case]
    ids, mask = left_pad(rows[0])
    ref_pos, ref_deltas = _reference(ids, mask, rows[1], rows[2])
    pos, deltas = get_rope_index(ids, mm_token_type_ids(ids, IMAGE, VIDEO), rows[1], rows[2], mask)
    np.testing.assert_array_equal(pos, ref_pos)
    np.testing.assert_array_equal(deltas, ref_deltas)
    full, _ = position_ids(ids, mask, image_grid_thw=rows[1], video_grid_thw=rows[2],
                           image_token_id=IMAGE, video_token_id=VIDEO)
    np.testing.assert_array_equal(full[1:], ref_pos)
    np.testing.assert_array_equal(full[0], np.where(mask == 0, 0, np.cumsum(mask, -1) - 1))


def test_text_only_rows_follow_the_mask():
    ids, mask = left_pad([[1, 2, 3, 4], [5, 6]])
    pos, deltas = position_ids(ids, mask, image_token_id=IMAGE, video_token_id=VIDEO)
    np.testing.assert_array_equal(pos[:, 1], [[0, 0, 0, 1]] * 4)
    assert not deltas.any()


def test_grid_mismatch_is_an_error():
    ids = np.array([[1, *[IMAGE] * 5, 2]])
    with pytest.raises(ValueError, match="does not match its grid"):
        get_rope_index(ids, mm_token_type_ids(ids, IMAGE, VIDEO), [[1, 4, 4]])
    with pytest.raises(ValueError, match="more image grids"):
        get_rope_index(np.array([[1, 2]]), np.zeros((1, 2), int), [[1, 4, 4]])
