"""Qwen3-VL preprocessing against transformers 5.23.0's processors (image: torchvision backend;
video; the full Qwen3VLProcessor), run in the oracle venv built by tests/_support/oracle_env.py."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tests._support import oracle_env
from tests.families.qwen3_vl._tiny_processor import RELEASED_IMAGE, RELEASED_VIDEO, write_processor_dir
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
    "im_33x31": _img(33, 31), "im_rgba_50x70": _img(50, 70)[..., [0, 1, 2, 0]],
    "im_grey_40x41": _img(40, 41)[..., :1],
    "v30_40x70": _vid(30, 40, 70), "v13_50x33": _vid(13, 50, 33), "v9_64x64": _vid(9, 64, 64),
    "v120_64x96": _vid(120, 64, 96), "v8_64x64": _vid(8, 64, 64), "v5_20x150": _vid(5, 20, 150),
    "v4_300x400": _vid(4, 300, 400), "v7_48x80": _vid(7, 48, 80),
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
    {"name": "presampled_frames",
     "videos": [{"key": "v7_48x80", "video_fps": 1.5, "indices": [0, 3, 5, 9, 12, 20, 21]}],
     "videos_kwargs": {"do_sample_frames": False}, "messages": [_user("video", "given frames")]},
    # the released budgets (image min_pixels 65536 up-scales; video budget 25M), released video
    # processor with max_video_tokens lowered so the per-frame cap bites on a small clip
    {"name": "released_image_video", "model": "released", "images": ["im_67x45", "im_13x700"],
     "videos": [{"key": "v30_40x70", "video_fps": 10.0}], "videos_kwargs": {"cap_pixels_per_frame": False},
     "messages": [_user("image", "video", "and", "image")]},
    {"name": "released_cap_off", "model": "released", "videos": [{"key": "v4_300x400", "video_fps": 4.0}],
     "videos_kwargs": {"cap_pixels_per_frame": False}, "messages": [_user("video", "uncapped")]},
    {"name": "released_cap_on", "model": "released", "videos": [{"key": "v4_300x400", "video_fps": 4.0}],
     "videos_kwargs": {"cap_pixels_per_frame": True}, "messages": [_user("video", "capped")]},
]
RELEASED_MODEL = {"image": RELEASED_IMAGE, "video": {**RELEASED_VIDEO, "max_video_tokens": 64}}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    work = tmp_path_factory.mktemp("qwen3vl_oracle")
    write_processor_dir(work / "model")
    write_processor_dir(work / "released", **RELEASED_MODEL)
    np.savez(work / "inputs.npz", **INPUTS)
    cases = [{"name": "images_only", "kind": "images", "images": IMAGE_KEYS},
             *({"kind": "processor", **c} for c in CASES)]
    (work / "cases.json").write_text(json.dumps(cases))
    shim = work / "shim.py"
    shim.write_text(oracle_env.import_shim())
    oracle_env.run_oracle(ORACLE, str(work), str(shim))
    return work


@pytest.fixture(scope="module")
def processors(oracle):
    return {name: Qwen3VLProcessor.from_pretrained(oracle / name) for name in ("model", "released")}


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


def _videos(case, processor):
    kw = case.get("videos_kwargs", {})
    if "cap_pixels_per_frame" in kw:  # a call-time override, like transformers' videos_kwargs
        processor.video_config = dataclasses.replace(processor.video_config,
                                                     cap_pixels_per_frame=kw["cap_pixels_per_frame"])
    sampled = kw.get("do_sample_frames") is False
    return [Video(INPUTS[v["key"]], v["video_fps"], fps=kw.get("fps"), num_frames=kw.get("num_frames"),
                  sampled=sampled, indices=v.get("indices")) for v in case.get("videos", [])]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_processor_matches_transformers(oracle, processors, case):
    ref = dict(np.load(oracle / f"{case['name']}.npz"))
    ours = processors[case.get("model", "model")]
    texts = [ours.apply_chat_template(m) for m in case["messages"]]
    assert texts == json.loads((oracle / f"{case['name']}.txt").read_text())
    ours = copy.copy(ours)
    out = ours(texts, images=[INPUTS[k] for k in case.get("images", [])], videos=_videos(case, ours))
    assert sorted(out) == sorted(ref)
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw", "video_grid_thw"):
        if key in ref:
            np.testing.assert_array_equal(out[key], ref[key], err_msg=key)
            assert out[key].dtype == ref[key].dtype, key
    for key in ("pixel_values", "pixel_values_videos"):
        if key in ref:
            assert out[key].shape == ref[key].shape and out[key].dtype == ref[key].dtype
            np.testing.assert_allclose(out[key], ref[key], rtol=0, atol=1e-6, err_msg=key)
    assert out["attention_mask"][:, 0].min() == 0 or out["attention_mask"].all()  # left padding
