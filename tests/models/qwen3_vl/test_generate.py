"""KV-cache generation vs transformers' greedy `generate` on the tiny random weights (fp32): 32
tokens, batches of 3 with left padding, with and without visual input; end tokens; sampling."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.qwen3_vl._oracle import (
    IMAGE,
    VIDEO,
    flax_model,
    left_pad,
    pixels,
    torch_model,
    visual_run,
)
from wfm_jax.models.qwen3_vl.generate import Sampling, choose, generate

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def models():
    tm = torch_model(seed=3)
    return tm, flax_model(tm)


def _reference(tm, ids, mask, n, eos, grid=None, pv=None, vgrid=None, pvv=None, logits=False):
    def t(a):
        return None if a is None else torch.tensor(np.asarray(a))
    types = np.where(ids == IMAGE, 1, np.where(ids == VIDEO, 2, 0))
    visual = {k: t(v) for k, v in {"pixel_values": pv, "image_grid_thw": grid, "pixel_values_videos": pvv,
                                       "video_grid_thw": vgrid}.items() if v is not None}
    with torch.no_grad():
        out = tm.generate(input_ids=t(ids), attention_mask=t(mask), mm_token_type_ids=t(types),
                          max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True, **visual)
    tokens = out.sequences[:, ids.shape[1]:].numpy()
    return (tokens, torch.stack(out.logits, 1).numpy()) if logits else tokens


def test_greedy_text_batch(models):
    tm, fm = models
    ids, mask = left_pad([[1, 40, 41, 42, 43, 44, 45], [1, 50, 51], [1, 60, 61, 62, 63]])
    ref = _reference(tm, ids, mask, 32, eos=[])
    got = generate(fm, ids, mask, max_new_tokens=32, eos_token_ids=[], pad_token_id=0)
    assert ref.shape == got.shape == (3, 32)
    np.testing.assert_array_equal(got, ref)


def test_greedy_visual_batch(models):
    """An image row, a video row (two frame groups) and a text row, left padded: the M-RoPE
    delta of each row carries into the decode positions."""
    tm, fm = models
    grid, vgrid = [[1, 4, 6]], [[2, 4, 4]]
    ids, mask = left_pad([[1, 7, *visual_run(IMAGE, grid[0]), 8, 9],
                          [1, *visual_run(VIDEO, vgrid[0]), 10],
                          [1, 11, 12]])
    pv, pvv = pixels(grid, seed=10), pixels(vgrid, seed=11)
    ref, ref_logits = _reference(tm, ids, mask, 32, [], grid, pv, vgrid, pvv, logits=True)
    got, logits = generate(fm, ids, mask, pixel_values=pv, image_grid_thw=grid,
                           pixel_values_videos=pvv, video_grid_thw=vgrid, max_new_tokens=32,
                           eos_token_ids=[], pad_token_id=0, return_logits=True)
    assert ref.shape == got.shape == (3, 32)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(logits, ref_logits, atol=2e-5, rtol=0)  # every step's logits


def test_end_token_stops_and_pads(models):
    """With an end token that one row emits early, that row pads after it, as transformers."""
    tm, fm = models
    ids, mask = left_pad([[1, 40, 41, 42, 43, 44, 45], [1, 50, 51], [1, 60, 61, 62, 63]])
    free = generate(fm, ids, mask, max_new_tokens=12, eos_token_ids=[], pad_token_id=0)
    eos = int(free[1, 3])  # row 1 ends at its 4th token
    ref = _reference(tm, ids, mask, 12, eos=eos)
    got = generate(fm, ids, mask, max_new_tokens=12, eos_token_ids=[eos], pad_token_id=0)
    np.testing.assert_array_equal(got, ref)
    assert (got[1, 4:] == 0).all()
    assert got[1, 3] == eos


def test_sampling_is_seeded(models):
    _, fm = models
    ids, mask = left_pad([[1, 40, 41], [1, 50]])
    hot = Sampling(temperature=1.5)
    a = generate(fm, ids, mask, max_new_tokens=8, sampling=hot, seed=1, eos_token_ids=[])
    b = generate(fm, ids, mask, max_new_tokens=8, sampling=hot, seed=1, eos_token_ids=[])
    c = generate(fm, ids, mask, max_new_tokens=8, sampling=hot, seed=2, eos_token_ids=[])
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    greedy = generate(fm, ids, mask, max_new_tokens=8, eos_token_ids=[])
    top1 = generate(fm, ids, mask, max_new_tokens=8, sampling=Sampling(1.0, top_k=1), seed=5,
                    eos_token_ids=[])
    np.testing.assert_array_equal(top1, greedy)


def test_choose_distribution():
    """temperature, top-k and top-p draws against the numpy distribution they define."""
    logits = jnp.asarray([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    draws = 8000
    keys = jax.random.split(jax.random.key(0), draws)

    def freq(sampling):
        tok = jax.vmap(lambda k: choose(logits, k, sampling)[0])(keys)
        return np.bincount(np.asarray(tok), minlength=6) / draws

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    base = np.asarray(logits[0], np.float64)
    np.testing.assert_allclose(freq(Sampling(0.7)), softmax(base / 0.7), atol=0.02)
    want = softmax(np.where(np.arange(6) < 3, base, -np.inf))
    np.testing.assert_allclose(freq(Sampling(1.0, top_k=3)), want, atol=0.02)
    p = softmax(base)  # top_p 0.8: the smallest set of most likely tokens holding >= 0.8
    keep = np.cumsum(p) - p < 0.8
    np.testing.assert_allclose(freq(Sampling(1.0, top_p=0.8)),
                               softmax(np.where(keep, base, -np.inf)), atol=0.02)
    assert (np.asarray(choose(logits, keys[0], Sampling())) == 0).all()


def test_bad_input_errors(models):
    _, fm = models
    ids, mask = left_pad([[1, 2, 3], [1]])
    with pytest.raises(ValueError, match="left padding"):
        generate(fm, ids, mask[:, ::-1], max_new_tokens=2)
    with pytest.raises(ValueError, match="bad sampling"):
        Sampling(temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(fm, ids, mask, max_new_tokens=0)


def test_scanned_layers_generate_the_same(models):
    """The KV cache carried through a lax.scan over the layers: same tokens as unrolled."""
    tm, fm = models
    grid = [[1, 4, 4]]
    ids, mask = left_pad([[1, *visual_run(IMAGE, grid[0]), 8], [1, 11, 12]])
    pv = pixels(grid, seed=13)
    kw = {"pixel_values": pv, "image_grid_thw": grid, "max_new_tokens": 10, "eos_token_ids": []}
    np.testing.assert_array_equal(generate(flax_model(tm, scan_layers=True), ids, mask, **kw),
                                  generate(fm, ids, mask, **kw))
