"""Qwen3-VL preprocessing against transformers 5.23.0's processors (image: torchvision backend;
video; the full Qwen3VLProcessor), run in the oracle venv built by tests/_support/oracle_env.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests._support import oracle_env
from tests.families.qwen3_vl._tiny_processor import write_processor_dir
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor, Video

ORACLE = Path(__file__).with_name("_oracle_processor.py")
RNG = np.random.default_rng(1234)


def _img(h, w):
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _vid(t, h, w):
    # smooth-ish frames so resampling differences show up as small, not saturated, errors
    base = RNG.integers(0, 256, (1, h, w, 3)).astype(np.int32)
    drift = np.arange(t, dtype=np.int32)[:, None, None, None] * 7
    return ((base + drift) % 256).astype(np.uint8)


# name -> array; (h, w) picked to cover: identity resize (multiples of 32 inside the budget), up-scaling
# below min_pixels, down-scaling above max_pixels, odd sizes and extreme aspect ratios.
INPUTS = {
    "im_96x96": _img(96, 96), "im_64x128": _img(64, 128), "im_67x45": _img(67, 45),
    "im_13x700": _img(13, 700), "im_300x17": _img(300, 17), "im_211x305": _img(211, 305),
    "im_33x31": _img(33, 31),
    "v30_40x70": _vid(30, 40, 70), "v13_50x33": _vid(13, 50, 33), "v9_64x64": _vid(9, 64, 64),
    "v120_64x96": _vid(120, 64, 96), "v8_64x64": _vid(8, 64, 64), "v5_20x150": _vid(5, 20, 150),
}
IMAGE_KEYS = [k for k in INPUTS if k.startswith("im_")]


def _user(*items):
    content = [{"type": it} if it in ("image", "video") else {"type": "text", "text": it} for it in items]
    return [{"role": "user", "content": content}]


# Each processor case: a batch of conversations, images in order, videos with their frame rate and
# the sampling kwargs passed to the processor call.
CASES = [
    {"name": "image_text_batch", "images": ["im_67x45"],
     "messages": [_user("image", "What is here?"), _user("Only text, a longer prompt than the first.")]},
    {"name": "two_images", "images": ["im_13x700", "im_96x96", "im_211x305"],
     "messages": [_user("image", "compare", "image"), _user("and", "image")]},
    {"name": "video_default_fps", "videos": [{"key": "v30_40x70", "video_fps": 10.0}],
     "messages": [_user("video", "What happens?")]},
    {"name": "video_fps1_min_frames", "videos": [{"key": "v13_50x33", "video_fps": 24.0}],
     "videos_kwargs": {"fps": 1}, "messages": [_user("video", "Describe.")]},
    {"name": "video_num_frames_odd", "videos": [{"key": "v9_64x64", "video_fps": 3.0}],
     "videos_kwargs": {"num_frames": 5, "fps": None}, "messages": [_user("video", "Count.")]},
    {"name": "video_long_fps4", "videos": [{"key": "v120_64x96", "video_fps": 30.0}],
     "videos_kwargs": {"fps": 4}, "messages": [_user("video", "Long clip."), _user("no media")]},
    {"name": "video_identity_fps2_5", "videos": [{"key": "v8_64x64", "video_fps": 2.5}],
     "videos_kwargs": {"fps": 2.5}, "messages": [_user("video", "x")]},
    {"name": "mixed_batch", "images": ["im_33x31"],
     "videos": [{"key": "v5_20x150", "video_fps": 7.0}, {"key": "v8_64x64", "video_fps": 24.0}],
     "messages": [_user("image", "then", "video"), _user("text only"), _user("video", "last")]},
]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    work = tmp_path_factory.mktemp("qwen3vl_oracle")
    write_processor_dir(work / "model")
    np.savez(work / "inputs.npz", **INPUTS)
    cases = [{"name": "images_only", "kind": "images", "images": IMAGE_KEYS},
             *({"kind": "processor", **c} for c in CASES)]
    (work / "cases.json").write_text(json.dumps(cases))
    shim = work / "shim.py"
    shim.write_text(oracle_env.import_shim())
    oracle_env.run_oracle(ORACLE, str(work), str(shim))
    return work


@pytest.fixture(scope="module")
def ours(oracle):
    return Qwen3VLProcessor.from_pretrained(oracle / "model")


def test_oracle_uses_the_qwen3_vl_classes(oracle):
    info = json.loads((oracle / "info.json").read_text())
    assert info == {"processor": "Qwen3VLProcessor", "image_processor": "Qwen2VLImageProcessor",
                    "fast_image_processor": "Qwen2VLImageProcessor",
                    "video_processor": "Qwen3VLVideoProcessor"}


@pytest.mark.parametrize(("backend", "tag"), [("torchvision", "fast"), ("pil", "pil")])
def test_images_match_both_image_backends(oracle, backend, tag):
    """Every size is resampled (or not) exactly as the matching transformers backend does it."""
    ref = np.load(oracle / "images_only.npz")
    ours = Qwen3VLProcessor.from_pretrained(oracle / "model", image_backend=backend)
    out = ours([" ".join(["<|image_pad|>"] * len(IMAGE_KEYS))], images=[INPUTS[k] for k in IMAGE_KEYS])
    np.testing.assert_array_equal(out["image_grid_thw"], ref[f"{tag}_image_grid_thw"])
    assert out["pixel_values"].dtype == np.float32
    np.testing.assert_allclose(out["pixel_values"], ref[f"{tag}_pixel_values"], rtol=0, atol=1e-6)
    # the two backends resample differently, so each must be matched on its own
    assert np.abs(ref["fast_pixel_values"] - ref["pil_pixel_values"]).max() > 1e-3


def _videos(case):
    kw = case.get("videos_kwargs", {})
    return [Video(INPUTS[v["key"]], v["video_fps"], fps=kw.get("fps"), num_frames=kw.get("num_frames"))
            for v in case.get("videos", [])]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_processor_matches_transformers(oracle, ours, case):
    ref = dict(np.load(oracle / f"{case['name']}.npz"))
    texts = [ours.apply_chat_template(m) for m in case["messages"]]
    assert texts == json.loads((oracle / f"{case['name']}.txt").read_text())
    out = ours(texts, images=[INPUTS[k] for k in case.get("images", [])], videos=_videos(case))
    assert sorted(out) == sorted(ref)
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw", "video_grid_thw"):
        if key in ref:
            np.testing.assert_array_equal(out[key], ref[key], err_msg=key)
    for key in ("pixel_values", "pixel_values_videos"):
        if key in ref:
            assert out[key].shape == ref[key].shape
            np.testing.assert_allclose(out[key], ref[key], rtol=0, atol=1e-6, err_msg=key)
    assert out["attention_mask"][:, 0].min() == 0 or out["attention_mask"].all()  # left padding
