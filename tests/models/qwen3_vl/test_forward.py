"""Flax Qwen3-VL vs transformers on identical random tiny weights, fp32, atol 2e-5: the vision
tower (merged tokens and DeepStack features), every decoder hidden state and the logits."""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.models.qwen3_vl._oracle import (
    IMAGE,
    VIDEO,
    flax_model,
    left_pad,
    pixels,
    torch_model,
    visual_run,
)
from wfm_jax.models.qwen3_vl import position_ids

torch = pytest.importorskip("torch")
ATOL = 2e-5


@pytest.fixture(scope="module")
def models():
    tm = torch_model(seed=0)
    return tm, flax_model(tm)


def _torch_forward(tm, ids, mask=None, pv=None, grid=None, pvv=None, vgrid=None):
    def t(a):
        return None if a is None else torch.tensor(np.asarray(a))
    types = np.where(ids == IMAGE, 1, np.where(ids == VIDEO, 2, 0))
    with torch.no_grad():
        out = tm(input_ids=t(ids), attention_mask=t(mask), pixel_values=t(pv), image_grid_thw=t(grid),
                 pixel_values_videos=t(pvv), video_grid_thw=t(vgrid), mm_token_type_ids=t(types),
                 output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


def _static(grid):
    """A grid as a hashable jit static argument (the model reads grids on the host)."""
    return None if grid is None else tuple(tuple(int(v) for v in row) for row in grid)


def _array(grid):
    return None if grid is None else np.asarray(grid)


# One compiled program per input layout: run eagerly, the model compiled each of its ~1300
# primitive ops on its own and the file took minutes; the numbers are the same program's.
@functools.partial(nnx.jit, static_argnames=("grid", "vgrid"))
def _jit_forward(fm, ids, mask, pos, pv, pvv, grid, vgrid):
    return fm(ids, mask, pos, pv, _array(grid), pvv, _array(vgrid), output_hidden_states=True)


@functools.partial(nnx.jit, static_argnames=("grid",))
def _jit_visual(fm, pv, grid):
    return fm.model.visual(pv, _array(grid))


def _flax_forward(fm, ids, mask=None, pv=None, grid=None, pvv=None, vgrid=None, positions=True):
    pos = None
    if positions:
        pos, _ = position_ids(ids, mask, image_grid_thw=grid, video_grid_thw=vgrid,
                              image_token_id=IMAGE, video_token_id=VIDEO)
    out = _jit_forward(fm, jnp.asarray(ids), None if mask is None else jnp.asarray(mask), pos, pv,
                       pvv, _static(grid), _static(vgrid))
    return np.asarray(out["logits"]), [np.asarray(h) for h in out["hidden_states"]]


def _assert_match(ref, got, mask=None):
    (ref_logits, ref_hidden), (logits, hidden) = ref, got
    keep = (slice(None),) if mask is None else np.asarray(mask, bool)
    assert len(hidden) == len(ref_hidden) == 3  # embeddings, layer 0 output, normed last
    for i, (a, b) in enumerate(zip(ref_hidden, hidden, strict=False)):
        np.testing.assert_allclose(b[keep], a[keep], atol=ATOL, rtol=0, err_msg=f"hidden state {i}")
    np.testing.assert_allclose(logits[keep], ref_logits[keep], atol=ATOL, rtol=0, err_msg="logits")


@pytest.mark.parametrize("grid", [
    [[1, 4, 6], [2, 6, 4]],  # an image and a two-frame-group video: equal segments (batched path)
    [[1, 4, 4], [1, 6, 8], [3, 4, 4]],  # unequal segments: the masked dense path
])
def test_vision_tower_matches(models, grid):
    tm, fm = models
    grid = np.array(grid)
    pv = pixels(grid, seed=1)
    with torch.no_grad():
        ref = tm.model.visual(torch.tensor(pv), grid_thw=torch.tensor(grid))
    merged, deepstack = _jit_visual(fm, jnp.asarray(pv), _static(grid))
    np.testing.assert_allclose(np.asarray(merged), ref.pooler_output.numpy(), atol=ATOL, rtol=0)
    assert len(deepstack) == len(ref.deepstack_features) == 2
    for a, b in zip(ref.deepstack_features, deepstack, strict=False):
        np.testing.assert_allclose(np.asarray(b), a.numpy(), atol=ATOL, rtol=0)


def test_text_only(models):
    tm, fm = models
    ids = np.array([[1, 7, 8, 9, 10, 11, 12, 300, 40]])
    _assert_match(_torch_forward(tm, ids), _flax_forward(fm, ids, positions=False))


def test_image_and_text(models):
    tm, fm = models
    grid = [[1, 4, 6]]
    ids = np.array([[1, 7, *visual_run(IMAGE, grid[0]), 8, 9, 10]])
    pv = pixels(grid, seed=2)
    _assert_match(_torch_forward(tm, ids, pv=pv, grid=grid), _flax_forward(fm, ids, pv=pv, grid=grid))


def test_video_and_text(models):
    tm, fm = models
    vgrid = [[2, 4, 6]]  # two frame groups, each with its timestamp token
    ids = np.array([[1, 7, *visual_run(VIDEO, vgrid[0]), 8, 9]])
    pvv = pixels(vgrid, seed=3)
    _assert_match(_torch_forward(tm, ids, pvv=pvv, vgrid=vgrid),
                  _flax_forward(fm, ids, pvv=pvv, vgrid=vgrid))


def test_padded_mixed_batch(models):
    """Left-padded rows: two images + text, a video + text, text only."""
    tm, fm = models
    grid, vgrid = [[1, 4, 4], [1, 6, 4]], [[2, 4, 4]]
    ids, mask = left_pad([[1, *visual_run(IMAGE, grid[0]), 20, *visual_run(IMAGE, grid[1]), 21],
                          [1, 22, *visual_run(VIDEO, vgrid[0]), 23, 24],
                          [1, 25, 26, 27]])
    pv, pvv = pixels(grid, seed=4), pixels(vgrid, seed=5)
    ref = _torch_forward(tm, ids, mask, pv, grid, pvv, vgrid)
    _assert_match(ref, _flax_forward(fm, ids, mask, pv, grid, pvv, vgrid), mask)


def test_padded_text_batch(models):
    """Text only with padding: transformers' forward keeps positions 0..L-1 (no visual input, so
    no M-RoPE index); the Flax default does the same."""
    tm, fm = models
    ids, mask = left_pad([[1, 7, 8, 9, 10, 11], [1, 12, 13]])
    ref = _torch_forward(tm, ids, mask)
    _assert_match(ref, _flax_forward(fm, ids, mask, positions=False), mask)


def test_scan_layers_equal_unrolled(models):
    tm, fm = models
    scanned = flax_model(tm, scan_layers=True, remat="full")
    grid = [[1, 4, 4]]
    ids, mask = left_pad([[1, *visual_run(IMAGE, grid[0]), 20], [1, 25, 26]])
    pv = pixels(grid, seed=6)
    a, b = _flax_forward(fm, ids, mask, pv, grid), _flax_forward(scanned, ids, mask, pv, grid)
    # not bit-equal: XLA fuses a scanned body differently (differences are float32 ulps)
    np.testing.assert_allclose(b[0], a[0], atol=1e-5, rtol=0)
    for x, y in zip(a[1], b[1], strict=False):
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)


def test_bf16_close_to_fp32(models):
    """bf16 compute (fp32 master weights): same argmax on most positions, logits within bf16
    rounding of the fp32 ones."""
    tm, fm = models
    bf16 = flax_model(tm, dtype=jnp.bfloat16)
    grid = [[1, 4, 4]]
    ids = np.array([[1, *visual_run(IMAGE, grid[0]), 20, 21, 22]])
    pv = pixels(grid, seed=7)
    ref, got = _flax_forward(fm, ids, pv=pv, grid=grid), _flax_forward(bf16, ids, pv=pv, grid=grid)
    assert got[0].dtype == jnp.bfloat16
    logits = got[0].astype(np.float32)
    scale = np.abs(ref[0]).max()
    assert np.abs(logits - ref[0]).max() < 0.05 * scale
    assert (logits.argmax(-1) == ref[0].argmax(-1)).mean() >= 0.8


def test_feature_count_mismatch_is_an_error(models):
    _, fm = models
    grid = [[1, 4, 4]]
    ids = np.array([[1, *[IMAGE] * 3, 20]])  # 3 pads, the grid gives 4 tokens
    with pytest.raises(ValueError, match="image features and image tokens do not match"):
        fm(jnp.asarray(ids), pixel_values=pixels(grid, 0), image_grid_thw=np.asarray(grid),
           position_ids=jnp.zeros((3, 1, 5), jnp.int32))
