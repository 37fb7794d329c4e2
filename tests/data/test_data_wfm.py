"""WFM layout: metas/ + videos/ (+ text_embedding/), embeddings, the pickle opt-in, errors."""
import pickle

import numpy as np
import pytest
from safetensors.numpy import save_file

from wfm_jax.data import DataError, wfm_loader
from wfm_jax.data.wfm import load_embedding, scan_wfm

SIZE = (8, 8)


def write_video(path, frames):
    import cv2
    t, h, w, _ = frames.shape
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 8, (w, h))
    for frame in frames:
        writer.write(np.ascontiguousarray(frame[:, :, ::-1]))
    writer.release()


def make_wfm(root, names=("a", "b", "c"), embedding=".npy"):
    for sub in ("metas", "videos"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if embedding:
        (root / "text_embedding").mkdir(exist_ok=True)
    embeddings = {}
    for i, name in enumerate(names):
        (root / "metas" / f"{name}.txt").write_text(f"  clip {name}\n")
        write_video(root / "videos" / f"{name}.mp4", np.full((5, 16, 16, 3), 40 * i, np.uint8))
        emb = np.full((4, 6), float(i), np.float32)
        embeddings[name] = emb
        path = root / "text_embedding" / f"{name}{embedding}"
        if embedding == ".npy":
            np.save(path, emb)
        elif embedding == ".safetensors":
            save_file({"t5": emb}, str(path))
        elif embedding == ".pickle":
            path.write_bytes(pickle.dumps([emb]))
    return embeddings


@pytest.fixture(scope="module")
def wfm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wfm")
    return root, make_wfm(root)


def test_scan_and_batches(wfm_dir):
    root, embeddings = wfm_dir
    records = scan_wfm(str(root))
    assert [r.name for r in records] == ["a", "b", "c"]
    assert [r.prompt for r in records] == ["clip a", "clip b", "clip c"]
    loader = wfm_loader(str(root), 2, SIZE, 3, seed=0)
    batch = next(loader)
    assert batch["pixels"].shape == (2, 3, 8, 8, 3) and batch["pixels"].dtype == np.uint8
    assert batch["text_embedding"].shape == (2, 4, 6)
    for prompt, emb in zip(batch["prompt"], batch["text_embedding"]):
        np.testing.assert_array_equal(emb, embeddings[prompt.split()[-1]])


def test_state_round_trip(wfm_dir):
    root, _ = wfm_dir
    loader = wfm_loader(str(root), 1, SIZE, 2, seed=4)
    next(loader)
    state = loader.state()
    want = [next(loader) for _ in range(3)]
    resumed = wfm_loader(str(root), 1, SIZE, 2, seed=4)
    resumed.restore(state)
    for w in want:
        got = next(resumed)
        assert got["prompt"] == w["prompt"]
        np.testing.assert_array_equal(got["pixels"], w["pixels"])  # same random frame window


def test_safetensors_embeddings(tmp_path):
    embeddings = make_wfm(tmp_path, names=("x", "y"), embedding=".safetensors")
    batch = next(wfm_loader(str(tmp_path), 2, SIZE, 2, shuffle=False))
    np.testing.assert_array_equal(batch["text_embedding"], np.stack([embeddings["x"], embeddings["y"]]))
    several = tmp_path / "several.safetensors"
    save_file({"a": np.zeros(2, np.float32), "b": np.ones(3, np.float32)}, str(several))
    assert sorted(load_embedding(str(several))) == ["a", "b"]


def test_pickle_refused_without_flag(tmp_path):
    embeddings = make_wfm(tmp_path, names=("p",), embedding=".pickle")
    with pytest.raises(DataError) as err:
        scan_wfm(str(tmp_path))
    msg = str(err.value)
    assert "p.pickle" in msg and "allow_pickle=True" in msg and "run code" in msg
    with pytest.raises(DataError, match="allow_pickle"):
        load_embedding(str(tmp_path / "text_embedding" / "p.pickle"))
    batch = next(wfm_loader(str(tmp_path), 1, SIZE, 2, allow_pickle=True))
    np.testing.assert_array_equal(batch["text_embedding"][0], embeddings["p"])


def test_npy_preferred_over_pickle(tmp_path):
    make_wfm(tmp_path, names=("q",), embedding=".pickle")
    np.save(tmp_path / "text_embedding" / "q.npy", np.zeros((2, 2), np.float32))
    assert scan_wfm(str(tmp_path))[0].embedding_path.endswith("q.npy")


def test_layout_errors(tmp_path):
    with pytest.raises(DataError, match="dataset dir not found"):
        scan_wfm(str(tmp_path / "missing"))
    make_wfm(tmp_path, names=("a", "b"))
    (tmp_path / "text_embedding" / "b.npy").unlink()
    with pytest.raises(DataError, match=r"videos/b\.mp4 has no text_embedding/b\.npy"):
        scan_wfm(str(tmp_path))
    (tmp_path / "metas" / "b.txt").unlink()
    with pytest.raises(DataError, match=r"b\.mp4 has no metas/b\.txt"):
        scan_wfm(str(tmp_path))
    (tmp_path / "metas" / "a.txt").write_text("   \n")
    (tmp_path / "videos" / "b.mp4").unlink()
    with pytest.raises(DataError, match=r"a\.txt is empty"):
        scan_wfm(str(tmp_path))


def test_corrupt_video_skipped(tmp_path):
    make_wfm(tmp_path, names=("a", "b"), embedding=None)
    (tmp_path / "videos" / "b.mp4").write_bytes(b"\x00" * 32)
    with pytest.raises(DataError, match=r"corrupt video .*b\.mp4"):
        next(wfm_loader(str(tmp_path), 2, SIZE, 2, shuffle=False))
    loader = wfm_loader(str(tmp_path), 1, SIZE, 2, shuffle=False, skip_bad=True)
    assert [next(loader)["prompt"] for _ in range(2)] == [["clip a"], ["clip a"]]
    assert loader.skipped == 1 and "b.mp4" in loader.bad_files[0]
