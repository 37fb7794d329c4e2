"""SFT paired layout: transform values, errors naming files, skip counting, state, sharding, video."""
import json

import numpy as np
import pytest
from PIL import Image

from wfm_jax.data import DataError, Shard, paired_loader
from wfm_jax.data.media import load_image, load_video_window
from wfm_jax.data.paired import scan_paired

SIZE = (16, 16)
N = 6


def write_pair(directory, stem, pixels, prompt, ext=".png"):
    Image.fromarray(pixels).save(directory / f"{stem}{ext}")
    (directory / f"{stem}.json").write_text(json.dumps({"prompt": prompt}))


def write_video(path, frames):
    import cv2
    t, h, w, _ = frames.shape
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 8, (w, h))
    for frame in frames:
        writer.write(np.ascontiguousarray(frame[:, :, ::-1]))  # OpenCV wants BGR
    writer.release()


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("paired")
    rng = np.random.default_rng(0)
    for i in range(N):
        shape = (16 + 2 * i, 24 + i, 3) if i % 2 else (30 + i, 18, 3)  # both orientations
        write_pair(d, f"s{i}", rng.integers(0, 256, shape, dtype=np.uint8), f"prompt {i}")
    (d / "unrelated.png").write_bytes(b"")  # media without JSON are ignored
    return d


def test_crop_only_matches_numpy(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (16, 25, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    out = load_image(str(tmp_path / "a.png"), SIZE)
    left = round((25 - 16) / 2)
    expected = pixels[:, left:left + 16]
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)


def test_resize_then_crop_matches_pil(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "b.png")
    out = load_image(str(tmp_path / "b.png"), (12, 20))
    # shorter side that must cover: width 30 -> 20 (scale 2/3); height 40 -> 27 (>= 12)
    ref = Image.fromarray(pixels).resize((20, 27), Image.Resampling.BILINEAR)
    top = round((27 - 12) / 2)
    expected = np.asarray(ref)[top:top + 12]
    assert out.shape == (12, 20, 3)
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.uint8  # [-1, 1] happens on the device


def test_batches_hold_matching_prompts_and_pixels(image_dir):
    loader = paired_loader(str(image_dir), 3, SIZE, seed=0)
    batch = next(loader)
    assert batch["pixels"].shape == (3, 16, 16, 3) and batch["pixels"].dtype == np.uint8
    for prompt, pixels in zip(batch["prompt"], batch["pixels"]):
        stem = "s" + prompt.split()[-1]
        np.testing.assert_array_equal(pixels, load_image(str(image_dir / f"{stem}.png"), SIZE))
    # one epoch = a permutation of the whole set
    seen = batch["prompt"] + next(loader)["prompt"]
    assert sorted(seen) == sorted(f"prompt {i}" for i in range(N))


def test_seeded_shuffle(image_dir):
    def order(seed):
        loader = paired_loader(str(image_dir), 1, SIZE, seed=seed)
        return [next(loader)["prompt"][0] for _ in range(2 * N)]
    a, b, c = order(5), order(5), order(6)
    assert a == b and a != c
    assert a[:N] != a[N:]  # every epoch is reshuffled
    assert sorted(a[N:]) == sorted(a[:N])


def test_state_round_trip_continues_with_next_batch(image_dir):
    loader = paired_loader(str(image_dir), 2, SIZE, seed=3)
    for _ in range(4):
        next(loader)
    state = json.loads(json.dumps(loader.state()))  # must survive a JSON checkpoint
    expected = [next(loader) for _ in range(4)]
    resumed = paired_loader(str(image_dir), 2, SIZE, seed=3)
    resumed.restore(state)
    for want in expected:
        got = next(resumed)
        assert got["prompt"] == want["prompt"]
        np.testing.assert_array_equal(got["pixels"], want["pixels"])


def test_per_process_shards_are_disjoint(image_dir):
    shards = [paired_loader(str(image_dir), 1, SIZE, seed=7, shard=Shard(i, 2)) for i in range(2)]
    seen = [[next(s)["prompt"][0] for _ in range(N // 2)] for s in shards]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(f"prompt {i}" for i in range(N))


def test_missing_prompt_names_file(tmp_path):
    write_pair(tmp_path, "ok", np.zeros((8, 8, 3), np.uint8), "fine")
    (tmp_path / "bad.png").write_bytes((tmp_path / "ok.png").read_bytes())
    (tmp_path / "bad.json").write_text(json.dumps({"caption": "x"}))
    with pytest.raises(DataError, match=r'bad\.json has no "prompt"'):
        scan_paired(str(tmp_path))


def test_layout_errors(tmp_path):
    with pytest.raises(DataError, match="dataset dir not found: '.*nope'"):
        scan_paired(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no X.json"):
        scan_paired(str(tmp_path))
    (tmp_path / "lonely.json").write_text(json.dumps({"prompt": "p"}))
    with pytest.raises(DataError, match=r"lonely\.json has no matching media"):
        scan_paired(str(tmp_path))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(DataError, match=r"cannot read .*broken\.json"):
        scan_paired(str(tmp_path))


def make_corrupt_dir(tmp_path):
    rng = np.random.default_rng(3)
    for i in range(4):
        write_pair(tmp_path, f"g{i}", rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), f"good {i}")
    (tmp_path / "x_bad.json").write_text(json.dumps({"prompt": "bad"}))
    good_png = (tmp_path / "g0.png").read_bytes()
    (tmp_path / "x_bad.png").write_bytes(good_png[: len(good_png) // 2])  # truncated
    return tmp_path


def test_corrupt_image_is_named(tmp_path):
    d = make_corrupt_dir(tmp_path)
    loader = paired_loader(str(d), 5, SIZE, seed=0)
    with pytest.raises(DataError, match=r"corrupt image .*x_bad\.png"):
        next(loader)


def test_corrupt_image_skipped_and_counted(tmp_path):
    d = make_corrupt_dir(tmp_path)
    # file order (no shuffle): g0 g1 g2 g3 x_bad | g0 g1 g2 g3 x_bad | ...
    loader = paired_loader(str(d), 2, SIZE, seed=0, skip_bad=True, shuffle=False)
    prompts = [p for _ in range(4) for p in next(loader)["prompt"]]
    assert prompts == [f"good {i}" for i in range(4)] * 2
    assert loader.skipped == 1
    assert next(loader)["prompt"] == ["good 0", "good 1"] and loader.skipped == 2
    assert len(loader.bad_files) == 1 and "x_bad.png" in loader.bad_files[0]
    state = loader.state()
    resumed = paired_loader(str(d), 2, SIZE, seed=0, skip_bad=True, shuffle=False)
    resumed.restore(state)
    assert resumed.skipped == 2 and next(resumed)["prompt"] == next(loader)["prompt"]


def test_all_bad_fails_instead_of_spinning(tmp_path):
    for i in range(2):
        (tmp_path / f"b{i}.png").write_bytes(b"not an image")
        (tmp_path / f"b{i}.json").write_text(json.dumps({"prompt": "p"}))
    loader = paired_loader(str(tmp_path), 1, SIZE, skip_bad=True)
    with pytest.raises(DataError, match="every sample .* is bad"):
        next(loader)


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    for i in range(2):
        frames = np.stack([np.full((24, 32, 3), 20 * t, np.uint8) for t in range(10)])
        write_video(d / f"v{i}.mp4", frames)
        (d / f"v{i}.json").write_text(json.dumps({"prompt": f"video {i}"}))
    return d


def frame_ids(window):
    """Frames were painted 20*t: recover t from the mean (mp4 is lossy, flat frames nearly exact)."""
    values = window.reshape(len(window), -1).mean(axis=1)
    return np.round(values / 20).astype(int)


def test_video_random_window(video_dir):
    path = str(video_dir / "v0.mp4")
    a = load_video_window(path, SIZE, 4, np.random.default_rng(11))
    b = load_video_window(path, SIZE, 4, np.random.default_rng(11))
    assert a.shape == (4, 16, 16, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    ids = frame_ids(a)
    np.testing.assert_array_equal(ids, ids[0] + np.arange(4))  # consecutive frames
    starts = {frame_ids(load_video_window(path, SIZE, 4, np.random.default_rng(s)))[0] for s in range(12)}
    assert len(starts) > 1 and min(starts) >= 0 and max(starts) <= 6


def test_video_loader_and_errors(video_dir, tmp_path):
    loader = paired_loader(str(video_dir), 2, SIZE, num_frames=3, seed=0)
    batch = next(loader)
    assert batch["pixels"].shape == (2, 3, 16, 16, 3)
    with pytest.raises(DataError, match=r"v0\.mp4 has 10 frames, fewer than train_frames=12"):
        load_video_window(str(video_dir / "v0.mp4"), SIZE, 12, np.random.default_rng(0))
    (tmp_path / "c.mp4").write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match=r"corrupt video .*c\.mp4"):
        load_video_window(str(tmp_path / "c.mp4"), SIZE, 2, np.random.default_rng(0))


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(image_dir):
    with paired_loader(str(image_dir), 2, SIZE, seed=9) as inline, \
            paired_loader(str(image_dir), 2, SIZE, seed=9, num_workers=1) as workers:
        want = [next(inline)["prompt"] for _ in range(4)]
        assert [next(workers)["prompt"] for _ in range(2)] == want[:2]
        state = json.loads(json.dumps(workers.state()))
    with paired_loader(str(image_dir), 2, SIZE, seed=9, num_workers=1) as resumed:
        resumed.restore(state)
        assert [next(resumed)["prompt"] for _ in range(2)] == want[2:]


def test_skipped_sample_is_said_once(tmp_path, capsys):
    d = make_corrupt_dir(tmp_path)
    loader = paired_loader(str(d), 2, SIZE, seed=0, skip_bad=True, shuffle=False)
    for _ in range(5):  # x_bad comes round twice
        next(loader)
    assert loader.skipped == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("skipped a bad sample (data.skip_bad_samples): ")
    assert "x_bad.png" in lines[0]
