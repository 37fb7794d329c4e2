"""WebDataset shards through grain (wfm_jax.data.webdataset): local tars and s3:// on the real
test server, the paired and the split layout, wdinfo JSON, per-process shard split, per-epoch
shuffle, and resume at many positions reading exactly the uninterrupted stream."""
from __future__ import annotations

import functools
import json
import operator

import numpy as np
import pytest

from tests import _shards
from wfm_jax.data.errors import DataError
from wfm_jax.data.loader import Shard
from wfm_jax.data.webdataset import Decode, WebDatasetLoader, resolve_shards

SIZE = (8, 8)


def _decode(skip=False):
    return Decode(SIZE, 1, seed=0, skip_bad=skip, allow_pickle=False)


def _loader(location, batch=2, keys=(), skip=False, **kw):
    return WebDatasetLoader(resolve_shards(location, keys), _decode(skip), batch, **kw)


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def _same(a, b):
    assert [x["prompt"] for x in a] == [x["prompt"] for x in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["pixels"], y["pixels"])


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    return str(root), _shards.paired_shards(str(root), shards=4, per_shard=3)


def _check_resume(location, total=14, positions=(0, 1, 3, 6, 11), **kw):
    with _loader(location, **kw) as ref:
        want = _take(ref, total)
    for at in positions:
        with _loader(location, **kw) as first:
            got = _take(first, at)
            state = json.loads(json.dumps(first.state()))
        with _loader(location, **kw) as second:
            second.restore(state)
            got += _take(second, total - at)
        _same(got, want)
    return want


def test_local_epochs_cover_every_sample_and_reshuffle(paired):
    root, prompts = paired
    with _loader(root, batch=3, cycle_length=2) as loader:
        epochs = [functools.reduce(operator.iadd, (b["prompt"] for b in _take(loader, 4)), []) for _ in range(2)]
    assert sorted(epochs[0]) == sorted(prompts) == sorted(epochs[1])
    assert epochs[0] != epochs[1]  # the shard order is redrawn each epoch
    assert next(iter(_loader(root, batch=1)))["pixels"].shape == (1, 8, 8, 3)


def test_local_resume_at_several_positions(paired):
    _check_resume(paired[0], cycle_length=2)


def test_processes_split_the_shards(paired):
    root, prompts = paired
    seen = []
    for index in range(2):
        with _loader(root, batch=3, shard=Shard(index, 2), cycle_length=2) as loader:
            seen.append(functools.reduce(operator.iadd, (b["prompt"] for b in _take(loader, 2)), []))
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == sorted(prompts)


def test_s3_stream_equals_local_and_resumes(paired, s3_server, s3_bucket):
    root, _ = paired
    _shards.upload_dir(s3_server.client(), root, s3_bucket, "data/train")
    url = f"s3://{s3_bucket}/data/train"
    assert len(resolve_shards(url).paths) == 4
    want = _check_resume(url, positions=(2, 7), cycle_length=3)
    with _loader(root, cycle_length=3) as local:
        _same(_take(local, 14), want)


def test_split_layout_and_wdinfo_on_s3(tmp_path, s3_server, s3_bucket):
    prompts = _shards.split_shards(str(tmp_path / "split"))
    shards = resolve_shards(str(tmp_path / "split"))
    assert shards.keys == ("images", "metas", "t5_xxl") and len(shards.paths) == 3
    _shards.upload_dir(s3_server.client(), str(tmp_path / "split"), s3_bucket, "wfm/v1")
    info = {"root": "wfm/v1", "data_list": [f"part_{i}.tar" for i in range(3)],
            "total_key_count": 9, "chunk_size": 3}
    s3_server.client().put_object(Bucket=s3_bucket, Key="wfm/wdinfo.json",
                                  Body=json.dumps(info).encode())
    url = f"s3://{s3_bucket}/wfm/wdinfo.json"
    with _loader(url, batch=3, cycle_length=3) as loader:
        batches = _take(loader, 3)
    assert sorted(functools.reduce(operator.iadd, (b["prompt"] for b in batches), [])) == sorted(prompts)
    b = batches[0]
    assert b["text_embedding"].shape == (3, 2, 4)
    for prompt, emb in zip(b["prompt"], b["text_embedding"]):
        i, j = map(int, prompt.split()[1:])
        assert emb[0, 0] == i * 10 + j  # each sample's keys come from the same sample
    _check_resume(url, total=6, positions=(1, 4), batch=2)


def test_resume_with_worker_processes(paired):
    _check_resume(paired[0], total=6, positions=(2,), num_workers=1, window=4)


def test_restore_refuses_another_stream(paired):
    root, _ = paired
    with _loader(root, seed=0) as a:
        next(a)
        state = a.state()
    with _loader(root, seed=1) as b, pytest.raises(DataError, match="seed 0 -> 1"):
        b.restore(state)


def test_bad_shards_and_samples_are_named(tmp_path):
    _shards.write_tar(str(tmp_path / "ok" / "a.tar"), [("k1.json", b'{"prompt": "p"}'),
                                                       ("k2.png", _shards.png(0))])
    with pytest.raises(DataError, match=r"sample 'k1': no media") as e:
        next(_loader(str(tmp_path / "ok"), batch=1))
    assert "a.tar" in str(e.value) and "\n" not in str(e.value)
    with _loader(str(tmp_path / "ok"), batch=1, skip=True) as loader, \
            pytest.raises(DataError, match="every sample .* is bad"):
        loader.num_records = 5
        next(loader)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tar").write_bytes(b"this is not a tar archive at all" * 40)
    with pytest.raises(DataError, match=r"shard .*x\.tar is not a (readable )?tar"):
        next(_loader(str(tmp_path / "bad"), batch=1))
    with pytest.raises(DataError, match="dataset not found"):
        resolve_shards(str(tmp_path / "bad" / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no \\*.tar shards"):
        resolve_shards(str(tmp_path / "empty"))


def test_bad_samples_skipped_and_counted(tmp_path):
    _shards.write_tar(str(tmp_path / "a.tar"), [
        ("good.json", b'{"prompt": "p"}'), ("good.png", _shards.png(0)),
        ("nojson.png", _shards.png(1)),
        ("broken.json", b'{"prompt": "q"}'), ("broken.png", b"not a png")])
    with _loader(str(tmp_path), batch=2, skip=True, cycle_length=1) as loader:
        batch = next(loader)
        assert batch["prompt"] == ["p", "p"]
        assert loader.skipped >= 2 and any("nojson" in m for m in loader.bad_files)
        assert any("broken.png" in m for m in loader.bad_files)


def test_indexed_records_read_back_the_same_images(tmp_path, s3_server, s3_bucket):
    """DDRL's view: every sample located once, its image re-read by one ranged read."""
    from wfm_jax.data.media import load_image
    from wfm_jax.data.paired import scan_paired
    from wfm_jax.data.webdataset import index_records, load_record_image
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    shapes = build_shapes_dataset(str(tmp_path / "shapes"), count=6, size=16, seed=0)
    _shards.shards_from_paired_dir(shapes, str(tmp_path / "tars"), per_shard=4)
    _shards.upload_dir(s3_server.client(), str(tmp_path / "tars"), s3_bucket, "ddrl")
    want = scan_paired(shapes)
    for location in (str(tmp_path / "tars"), f"s3://{s3_bucket}/ddrl"):
        got = index_records(location)
        assert [r.prompt for r in got] == [r.prompt for r in want]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(load_record_image(g, SIZE), load_image(w.media_path, SIZE))


def test_window_shuffle_mixes_samples_and_resumes(paired):
    root, _ = paired
    with _loader(root, batch=1, cycle_length=1, window=1) as plain, \
            _loader(root, batch=1, cycle_length=1, window=5) as mixed:
        a, b = (functools.reduce(operator.iadd, (x["prompt"] for x in _take(it, 10)), []) for it in (plain, mixed))
    assert sorted(a) == sorted(b) and a != b
    _check_resume(root, total=14, positions=(1, 2, 5, 9), cycle_length=2, window=4)


def test_world_model_split_layout_with_videos(tmp_path):
    """cosmos-rl's video/ metas/ t5_xxl/ trees: (B, T, H, W, 3) clips, deterministic windows,
    pickled embeddings only with allow_pickle."""
    import pickle

    from tests.data.test_data_wfm import write_video
    videos, metas, embeds = [], [], []
    for j in range(3):
        write_video(tmp_path / "clip.mp4", np.random.default_rng(j).integers(
            0, 256, (8, 16, 16, 3), dtype=np.uint8))
        videos.append((f"c{j}.mp4", (tmp_path / "clip.mp4").read_bytes()))
        metas.append((f"c{j}.json", json.dumps({"caption": f"clip {j}"}).encode()))
        embeds.append((f"c{j}.pickle", pickle.dumps({"emb": np.full((2, 3), j, np.float32)})))
    for key, members in (("video", videos), ("metas", metas), ("t5_xxl", embeds)):
        _shards.write_tar(str(tmp_path / "wm" / key / "part_0.tar"), members)
    shards = resolve_shards(str(tmp_path / "wm"))
    with pytest.raises(DataError, match="allow_pickle=True"):
        next(WebDatasetLoader(shards, _decode(), 1))
    decode = Decode(SIZE, 4, seed=0, skip_bad=False, allow_pickle=True)
    with WebDatasetLoader(shards, decode, 3, cycle_length=1) as a, \
            WebDatasetLoader(shards, decode, 3, cycle_length=1) as b:
        x, y = next(a), next(b)
    assert x["pixels"].shape == (3, 4, 8, 8, 3) and x["pixels"].dtype == np.uint8
    np.testing.assert_array_equal(x["pixels"], y["pixels"])
    assert sorted(x["prompt"]) == ["clip 0", "clip 1", "clip 2"]
    assert [int(e[0, 0]) for e in x["text_embedding"]["emb"]] == [int(p[-1]) for p in x["prompt"]]


def test_broken_shard_skipped_and_counted(tmp_path):
    _shards.paired_shards(str(tmp_path), shards=2, per_shard=2)
    (tmp_path / "shard_0009.tar").write_bytes(b"garbage, not a tar" * 100)
    with _loader(str(tmp_path), batch=4, skip=True, cycle_length=3) as loader:
        assert sorted(next(loader)["prompt"]) == ["sample 0 0", "sample 0 1", "sample 1 0",
                                                  "sample 1 1"]
        assert loader.skipped == 1 and "shard_0009.tar is not a tar" in loader.bad_files[0]


def test_s3_shards_with_wrong_secret_or_missing_bucket(paired, s3_server, s3_bucket, monkeypatch):
    from wfm_jax.io.storage.s3 import S3Error
    with pytest.raises(S3Error, match="bucket 'no-such-shards' does not exist"):
        resolve_shards("s3://no-such-shards/train")
    monkeypatch.setenv("PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(S3Error, match="rejected the secret key .*PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY"):
        resolve_shards(f"s3://{s3_bucket}/train")
