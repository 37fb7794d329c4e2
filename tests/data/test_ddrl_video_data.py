"""DDRL's data term reads videos: the paired layout with clips, the WFM layout and shards; the
window is fixed by (seed, step, item); a dataset of the wrong kind for the recipe is one line."""
import io
import tarfile

import numpy as np
import pytest

from tests.data.test_data_wfm import make_wfm, write_video
from wfm_jax.algorithms.ddrl.algorithm import DDRL
from wfm_jax.config.recipe import load_config
from wfm_jax.data import DataError
from wfm_jax.data.media import load_video_window
from wfm_jax.data.records import scan_records
from wfm_jax.data.webdataset import index_records, load_record_media

SIZE = (8, 8)


def _ramp(t=7, value=0):
    """A clip whose frame i is flat grey 30 * i + value: a window's start is readable back."""
    return np.stack([np.full((16, 16, 3), 30 * i + value, np.uint8) for i in range(t)])


@pytest.fixture(scope="module")
def paired_videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired_video")
    for name, value in (("a", 0), ("b", 5)):
        (root / f"{name}.json").write_text(f'{{"prompt": "clip {name}"}}')
        write_video(root / f"{name}.mp4", _ramp(value=value))
    return root


def _config(local_dir, is_video=True, family="wan"):
    c = load_config("configs/tiny_ddrl.py")
    c.policy.family = family
    c.policy.diffusers.is_video = is_video
    c.policy.diffusers.train_frames = 3
    ds = c.train.train_policy.dataset
    ds.local_dir, ds.build_tiny = str(local_dir), False
    c.validation.dataset.local_dir = ""
    c.validation.dataset.holdout_fraction = 0.0
    return c


def test_paired_and_wfm_video_records_load_windows(paired_videos, tmp_path):
    records = scan_records(str(paired_videos))
    assert [r.prompt for r in records] == ["clip a", "clip b"] and all(r.is_video for r in records)
    rng = np.random.default_rng(3)
    got = load_record_media(records[1], SIZE, 3, np.random.default_rng(3))
    want = load_video_window(str(paired_videos / "b.mp4"), SIZE, 3, rng)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (3, 8, 8, 3)
    assert got.dtype == np.uint8  # mapped to [-1, 1] on the device
    steps = np.diff(got[:, 0, 0, 0].astype(int))  # consecutive frames of the ramp: 30 apart
    np.testing.assert_allclose(steps, 30, atol=3)

    make_wfm(tmp_path / "wfm", embedding=None)
    wfm = scan_records(str(tmp_path / "wfm"))
    assert [r.prompt for r in wfm] == ["clip a", "clip b", "clip c"]
    clip = load_record_media(wfm[2], SIZE, 3, np.random.default_rng(0))
    assert clip.shape == (3, 8, 8, 3) and abs(float(clip.mean()) - 80) < 0.05 * 127.5
    with pytest.raises(ValueError, match="needs an rng"):
        load_record_media(wfm[0], SIZE, 3)


def test_video_records_in_shards_equal_the_files(paired_videos, tmp_path):
    shard = tmp_path / "shards" / "000000.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tar:
        for name in ("a", "b"):
            for ext in ("json", "mp4"):
                data = (paired_videos / f"{name}.{ext}").read_bytes()
                info = tarfile.TarInfo(f"{name}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    in_tar = index_records(str(shard.parent))
    assert [r.is_video for r in in_tar] == [True, True]
    for t, f in zip(in_tar, scan_records(str(paired_videos))):
        np.testing.assert_array_equal(load_record_media(t, SIZE, 3, np.random.default_rng(1)),
                                      load_record_media(f, SIZE, 3, np.random.default_rng(1)))


def test_ddrl_records_take_videos_for_video_recipes_only(paired_videos, tmp_path):
    train, val = DDRL.records(DDRL.Config(), _config(paired_videos))
    assert len(train) == 2 and val == []
    with pytest.raises(DataError, match=r"holds videos but the recipe's sd3 model takes images"):
        DDRL.records(DDRL.Config(), _config(paired_videos, is_video=False, family="sd3"))
    (tmp_path / "img.json").write_text('{"prompt": "x"}')
    from PIL import Image
    Image.new("RGB", (8, 8)).save(tmp_path / "img.png")
    with pytest.raises(DataError, match=r"holds images but the recipe's wan model takes videos"):
        DDRL.records(DDRL.Config(), _config(tmp_path))
