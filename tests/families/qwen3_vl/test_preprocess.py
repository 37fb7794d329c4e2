"""Qwen3-VL preprocessing pieces against transformers 5.23.0 in the project environment (no
torchvision needed: the PIL image processor, the pure-python resize/sampling/timestamp rules, and
torch's own uint8 antialiased bicubic kernel). The full processors run in test_preprocess_oracle.py."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor as HFProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_smart_resize_video
from transformers.video_utils import VideoMetadata

from tests.families.qwen3_vl._tiny_processor import RELEASED_IMAGE, RELEASED_VIDEO, write_processor_dir
from wfm_jax.families.qwen3_vl import preprocess as pp

RNG = np.random.default_rng(0)


def test_smart_resize_matches_transformers():
    for _ in range(2000):
        h, w = (int(v) for v in RNG.integers(1, 3000, 2))
        if max(h, w) / min(h, w) > 200:
            continue
        lo = int(RNG.choice([56 * 56, 4096, 65536]))
        hi = int(RNG.choice([160 * 160, 28 * 28 * 1280, 16777216]))
        assert pp.smart_resize(h, w, 32, lo, hi) == hf_smart_resize(h, w, 32, lo, hi), (h, w, lo, hi)
        t = int(RNG.integers(2, 64))
        assert pp.smart_resize_video(t, h, w, 2, 32, lo, hi * 4) == hf_smart_resize_video(
            t, h, w, temporal_factor=2, factor=32, min_pixels=lo, max_pixels=hi * 4), (t, h, w)


def test_spec_token_counts():
    # reason2.md 2.1: with the released min_pixels a 64x64 image becomes 256x256 -> 64 visual tokens
    cfg = pp.VisionConfig.from_dict(RELEASED_IMAGE, pp.IMAGE_CLASS_DEFAULTS)
    patches, grid = pp.preprocess_image(np.zeros((64, 64, 3), np.uint8), cfg)
    assert grid == (1, 16, 16) and patches.shape == (256, 1536) and np.prod(grid) // 4 == 64
    assert pp.smart_resize(96, 96, 32, 9216, 16777216) == (96, 96)  # the tiny VQA world's size


@pytest.mark.parametrize("released", [True, False])
def test_pil_backend_matches_transformers_pil_processor(released, tmp_path):
    d = write_processor_dir(tmp_path, image=RELEASED_IMAGE if released else None)
    ours = pp.Qwen3VLProcessor.from_pretrained(d, image_backend="pil")
    ref = Qwen2VLImageProcessorPil.from_pretrained(str(d))
    sizes = [(64, 64), (67, 45), (13, 700), (700, 13), (211, 305), (33, 31), (96, 128), (1000, 1500)]
    images = [RNG.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    rgba = np.dstack([images[5], images[5][..., :1]])  # transparency is composited onto white
    images += [Image.fromarray(images[1][..., 0]), Image.fromarray(rgba), rgba, images[6][..., :1]]
    want = ref(images=images, return_tensors="np")
    got = ours(" ".join(["<|image_pad|>"] * len(images)), images=images)
    np.testing.assert_array_equal(got["image_grid_thw"], want["image_grid_thw"])
    np.testing.assert_allclose(got["pixel_values"], want["pixel_values"], rtol=0, atol=1e-6)
    n_visual = sum(int(np.prod(g)) // 4 for g in want["image_grid_thw"])
    assert got["input_ids"].shape[1] == n_visual + len(images) - 1  # plus the spaces between pads


@pytest.mark.parametrize(("h", "w", "oh", "ow"), [(67, 45, 64, 64), (300, 17, 160, 32), (13, 700, 32, 160),
                                                  (211, 305, 128, 192), (40, 70, 64, 96), (8, 9, 32, 32)])
def test_torchvision_resize_is_torch_uint8_kernel(h, w, oh, ow):
    """torchvision's uint8 bicubic resize on CPU is aten's antialiased uint8 kernel; torch alone has it."""
    frames = RNG.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    want = torch.nn.functional.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous(),
                                           size=(oh, ow), mode="bicubic", align_corners=False, antialias=True)
    got = pp._resize(frames, oh, ow, 3, "torchvision")
    np.testing.assert_array_equal(got, want.permute(0, 2, 3, 1).numpy())


def test_frame_sampling_and_timestamps_match_transformers():
    cfg = pp.VisionConfig.from_dict({**RELEASED_VIDEO, "max_frames": 48}, pp.VIDEO_CLASS_DEFAULTS)
    for _ in range(400):
        total = int(RNG.integers(2, 400))
        video_fps = float(RNG.choice([1.0, 2.5, 7.0, 23.976, 24.0, 30.0, 60.0]))
        by_fps = RNG.random() < 0.7
        fps = float(RNG.choice([0.5, 1, 2, 4])) if by_fps else None
        num = None if by_fps else int(RNG.integers(1, 40))
        fake = SimpleNamespace(fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames)
        want = Qwen3VLVideoProcessor.sample_frames(fake, VideoMetadata(total_num_frames=total, fps=video_fps),
                                                   num_frames=num, fps=fps)
        got = pp.sample_frame_indices(total, video_fps, cfg, fps=fps, num_frames=num)
        np.testing.assert_array_equal(got, want)
        assert pp.frame_group_timestamps(got, video_fps, 2) == HFProcessor._calculate_timestamps(
            None, list(want), video_fps, 2)


def test_video_patch_order_and_temporal_padding():
    cfg = pp.VisionConfig.from_dict(RELEASED_VIDEO, pp.VIDEO_CLASS_DEFAULTS)
    frames = RNG.integers(0, 256, (3, 64, 96, 3), dtype=np.uint8)  # identity resize, odd frame count
    patches, grid = pp.preprocess_video(frames, cfg)
    assert grid == (2, 4, 6) and patches.shape == (48, 1536)
    # row r of the second temporal group, merge block (0, 1), inner (1, 0): patch row 1, col 2
    row = 24 + 1 * 4 + 2
    vec = patches[row].reshape(3, 2, 16, 16)
    expect = (frames[2, 16:32, 32:48].transpose(2, 0, 1).astype(np.float32) - 127.5) / 127.5
    np.testing.assert_allclose(vec[:, 0], expect, atol=1e-6)
    np.testing.assert_allclose(vec[:, 1], expect, atol=1e-6)  # last frame repeated to fill the pair


def test_config_priority_and_legacy_pixel_keys(tmp_path):
    d = write_processor_dir(tmp_path, image={**RELEASED_IMAGE, "min_pixels": 1234, "max_pixels": 99999})
    image, video = pp.load_vision_configs(d)
    ref = Qwen2VLImageProcessorPil.from_pretrained(str(d))
    assert (image.min_pixels, image.max_pixels) == (ref.size["shortest_edge"], ref.size["longest_edge"])
    assert (video.min_pixels, video.fps) == (4 * 32 * 32, 2)
    (d / "processor_config.json").write_text(json.dumps(
        {"video_processor": {**RELEASED_VIDEO, "fps": 1}}))  # a 5.x nested processor_config wins
    assert pp.load_vision_configs(d)[1].fps == 1
    (d / "video_preprocessor_config.json").unlink()
    (d / "processor_config.json").unlink()
    assert pp.load_vision_configs(d)[1].patch_size == 16  # falls back to preprocessor_config.json


def test_bad_inputs_get_one_clear_error(tmp_path):
    d = write_processor_dir(tmp_path / "m")
    proc = pp.Qwen3VLProcessor.from_pretrained(d)
    img = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(ValueError, match="1 <\\|image_pad\\|> placeholders but 2"):
        proc("<|image_pad|>", images=[img, img])
    with pytest.raises(ValueError, match="frame rate"):
        proc("<|video_pad|>", videos=[pp.Video(np.zeros((8, 64, 64, 3), np.uint8), None)])
    with pytest.raises(ValueError, match="at least 2 frames"):
        proc("<|video_pad|>", videos=[pp.Video(np.zeros((1, 64, 64, 3), np.uint8), 2.0, sampled=True)])
    with pytest.raises(ValueError, match="aspect ratio"):
        proc("<|image_pad|>", images=[np.zeros((2, 500, 3), np.uint8)])
    with pytest.raises(ValueError, match="uint8"):
        proc("<|image_pad|>", images=[np.zeros((64, 64, 3), np.float32)])
    with pytest.raises(ValueError, match="mutually exclusive"):
        pp.sample_frame_indices(10, 2.0, proc.video_config, fps=1, num_frames=4)
    (d / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        pp.Qwen3VLProcessor.from_pretrained(d)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        pp.Qwen3VLProcessor.from_pretrained(tmp_path)


def test_left_padding_and_token_types(tmp_path):
    proc = pp.Qwen3VLProcessor.from_pretrained(write_processor_dir(tmp_path))
    content = [{"type": "image"}, {"type": "text", "text": "hi"}]
    text = [proc.apply_chat_template([{"role": "user", "content": content}]), "x"]
    out = proc(text, images=[np.zeros((64, 96, 3), np.uint8)])
    assert out["input_ids"].shape == out["attention_mask"].shape == out["mm_token_type_ids"].shape
    assert out["attention_mask"][1].tolist() == [0] * (out["input_ids"].shape[1] - 1) + [1]
    assert (out["input_ids"][1, :-1] == proc.tokenizer.pad_token_id).all()
    assert int((out["mm_token_type_ids"] == 1).sum()) == math.prod((1, 4, 6)) // 4
    assert text[0].startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n")


def test_read_video_and_user_turn(tmp_path):
    import cv2

    path = str(tmp_path / "clip.avi")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 12.0, (80, 48))
    for i in range(10):
        writer.write(np.full((48, 80, 3), (20 * i, 0, 200), np.uint8))  # BGR
    writer.release()
    video = pp.read_video(path)
    assert video.frames.shape == (10, 48, 80, 3) and video.video_fps == pytest.approx(12.0)
    assert abs(int(video.frames[3, 10, 10, 0]) - 200) <= 3 and abs(int(video.frames[3, 10, 10, 2]) - 60) <= 3
    with pytest.raises(ValueError, match="cannot open"):
        pp.read_video(tmp_path / "missing.mp4")
    proc = pp.Qwen3VLProcessor.from_pretrained(write_processor_dir(tmp_path / "m"))
    text = proc.apply_chat_template(pp.user_turn("what?", videos=1))
    assert text == ("<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>what?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    out = proc(text, videos=[video])  # 10 frames at 12 fps, sampled at 2 fps -> min 4 frames -> 2 groups
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]]  # 48x80 -> 64x64: round(1.5) = 2, round(2.5) = 2
