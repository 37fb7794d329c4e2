"""Validation media: the captioned video grid (tiles in lockstep, captions drawn) and
write_validation's dispatch (PNG for images, an mp4 OpenCV reads back for videos)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from wfm_jax.train.image_grid import GridGeometry
from wfm_jax.train.validation_out import write_validation
from wfm_jax.train.video_grid import captioned_video_grid

B, T, H, W = 3, 4, 16, 16


def videos() -> np.ndarray:
    """(B, T, H, W, 3) uint8: sample i, frame t is one colour, distinct for every (i, t)."""
    out = np.zeros((B, T, H, W, 3), np.uint8)
    for i in range(B):
        for t in range(T):
            out[i, t] = (40 * i + 10, 50 * t + 20, 200 - 30 * i)
    return out


class Recorder:
    def __init__(self):
        self.calls = []

    def log_image(self, key, path, caption=None, step=None):
        self.calls.append(("image", key, path, step))

    def log_video(self, key, path, caption=None, step=None):
        self.calls.append(("video", key, path, step))


def test_tiles_play_in_lockstep_under_their_captions():
    v = videos()
    grid = captioned_video_grid(v, ["red cube | 0.5", "", "a long prompt about a dog | -1.25"])
    geo = GridGeometry.of(B, H, W)
    gw, gh = geo.size
    assert (geo.cols, geo.rows, geo.zoom) == (2, 2, 8)
    assert grid.shape == (T, gh + gh % 2, gw + gw % 2, 3) and grid.dtype == np.uint8
    for i in range(B):
        x, y = geo.origin(i)
        for t in range(T):  # every tile shows its own frame t, upscaled nearest
            tile = grid[t, y:y + geo.cell_h, x:x + geo.cell_w]
            assert (tile == v[i, t, 0, 0]).all(), (i, t)
        caption = grid[:, y + geo.cell_h:y + geo.cell_h + geo.text_h, x:x + geo.cell_w]
        written = (caption != 255).any()
        assert written == (i != 1), i  # text under captioned tiles only, on every frame alike
        assert (caption == caption[0]).all()
    x, y = geo.origin(B)  # the empty fourth cell stays white
    assert (grid[:, y:, x:] == 255).all()


def test_float_pixels_and_bad_input():
    v = videos()
    as_float = captioned_video_grid(v.astype(np.float32) / 255, ["a"] * B)
    np.testing.assert_array_equal(as_float, captioned_video_grid(v, ["a"] * B))
    # a 3x3 clip zooms to 129-pixel tiles: the grid is padded to even sizes (mp4 codecs)
    odd = captioned_video_grid(np.zeros((1, 2, 3, 3, 3), np.uint8), ["x"])
    assert GridGeometry.of(1, 3, 3).size == (129, 169) and odd.shape == (2, 170, 130, 3)
    assert (odd[:, 169] == 255).all() and (odd[:, :, 129] == 255).all()
    with pytest.raises(ValueError, match=r"\(B, T, H, W, 3\)"):
        captioned_video_grid(v[:, 0], ["a"] * B)
    with pytest.raises(ValueError, match="2 captions for 3 videos"):
        captioned_video_grid(v, ["a", "b"])


def test_write_validation_video_is_an_mp4_opencv_reads(tmp_path):
    log = Recorder()
    path = write_validation(videos().astype(np.float32) / 255, ["a", "b", "c"],
                            np.array([0.1, 0.2, 0.3]), str(tmp_path / "validation"), 7, logger=log)
    assert path == str(tmp_path / "validation" / "step_7.mp4")
    geo = GridGeometry.of(B, H, W)
    cap = cv2.VideoCapture(path)
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    gw, gh = geo.size
    assert len(frames) == T and frames[0].shape == (gh + gh % 2, gw + gw % 2, 3)
    # lossy codec: the middle of tile 0 is still its colour (BGR), frame by frame
    x, y = geo.origin(0)
    for t, frame in enumerate(frames):
        centre = frame[y + geo.cell_h // 2, x + geo.cell_w // 2][::-1].astype(int)
        assert np.abs(centre - videos()[0, t, 0, 0]).max() <= 12, t
    assert log.calls == [("video", "val/videos", path, 7)]


def test_write_validation_images_stay_a_png_grid(tmp_path):
    log = Recorder()
    images = videos()[:, 0]
    path = write_validation(images, ["a", "b", "c"], [1.0, 2.0, 3.0], str(tmp_path), 3, logger=log)
    assert path.endswith("step_3.png") and log.calls == [("image", "val/images", path, 3)]
    grid = np.asarray(Image.open(path))
    x, y = GridGeometry.of(B, H, W).origin(2)
    assert (grid[y, x] == images[2, 0, 0]).all()
    with pytest.raises(ValueError, match=r"images \(B, H, W, 3\) or videos"):
        write_validation(images[0], ["a"] * 16, [0.0] * 16, str(tmp_path), 0)
    with pytest.raises(ValueError, match="2 prompts and 3 rewards for 3 samples"):
        write_validation(images, ["a", "b"], [0.0] * 3, str(tmp_path), 0)


def test_validation_video_reaches_wandb_offline(tmp_path, monkeypatch):
    import warnings

    pytest.importorskip("wandb")
    from wfm_jax.train.metrics import MetricsLogger
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"enable": True, "project": "wfm_jax_test", "dir": str(tmp_path / "wb")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a swallowed wandb failure would warn
        logger = MetricsLogger(str(tmp_path / "out"), total_steps=2, wandb_cfg=cfg)
        logger.log(1, {"val/reward_mean": 0.5})
        write_validation(videos(), ["a", "b", "c"], [0.1, 0.2, 0.3], str(tmp_path / "val"), 1,
                         logger=logger)
        logger.log(2, {"val/reward_mean": 0.25})  # commits step 1's video
        assert "val/videos" in dict(logger.run.summary)
        logger.close()
