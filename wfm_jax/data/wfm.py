"""WFM local-dataset layout (cosmos-rl world-foundation-model stack):

    local_dir/metas/<name>.txt              prompt text
    local_dir/videos/<name>.mp4             the clip
    local_dir/text_embedding/<name>.npy     optional precomputed text embedding
                            <name>.safetensors   (one tensor -> array, several -> dict)
                            <name>.pickle        only with dataset.allow_pickle=True

Batches: {"pixels": uint8 (B, T, H, W, 3), "prompt": list[str],
"text_embedding": (B, ...) array or dict of arrays, when the dir has embeddings}.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pickle

import numpy as np

from wfm_jax.data import media
from wfm_jax.data.errors import BadSample, DataError
from wfm_jax.data.loader import Loader, Shard, local_batch_size, process_shard

EMBEDDING_EXTS = (".npy", ".safetensors", ".pickle", ".pkl")  # in order of preference
PICKLE_FLAG = "train.train_policy.dataset.allow_pickle"


@dataclasses.dataclass(frozen=True)
class WfmRecord:
    name: str
    prompt: str
    video_path: str
    embedding_path: str | None

    # what the record loaders of the paired layouts read (DDRL's data term takes either layout)
    is_video = True

    @property
    def media_path(self) -> str:
        return self.video_path


def _stems(directory: str, exts: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for file in sorted(os.listdir(directory)):
        stem, ext = os.path.splitext(file)
        if ext.lower() in exts:
            found.setdefault(stem, []).append(file)
    return found


def _read_meta(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            prompt = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if not prompt:
        raise DataError(f"{path} is empty (no prompt)")
    return prompt


def _pick_embedding(directory: str, name: str, files: list[str], allow_pickle: bool) -> str:
    by_ext = {os.path.splitext(f)[1].lower(): f for f in files}
    for ext in EMBEDDING_EXTS:
        if ext in by_ext:
            if ext in (".pickle", ".pkl") and not allow_pickle:
                raise DataError(f"{os.path.join(directory, by_ext[ext])}: pickle files can run code when "
                                f"loaded; convert it to .npy/.safetensors or set {PICKLE_FLAG}=True")
            return os.path.join(directory, by_ext[ext])
    raise DataError(f"no text embedding for '{name}' in {directory}")


def scan_wfm(local_dir: str, allow_pickle: bool = False) -> list[WfmRecord]:
    """Records sorted by name; every video needs its meta (and embedding, when the dir exists)."""
    if not local_dir or not os.path.isdir(local_dir):
        raise DataError(f"dataset dir not found: '{local_dir}' (train.train_policy.dataset.local_dir)")
    metas_dir, videos_dir = os.path.join(local_dir, "metas"), os.path.join(local_dir, "videos")
    for d in (metas_dir, videos_dir):
        if not os.path.isdir(d):
            raise DataError(f"WFM dataset {local_dir} has no {os.path.basename(d)}/ directory")
    metas, videos = _stems(metas_dir, (".txt",)), _stems(videos_dir, media.VIDEO_EXTS)
    emb_dir = os.path.join(local_dir, "text_embedding")
    embeddings = _stems(emb_dir, EMBEDDING_EXTS) if os.path.isdir(emb_dir) else None
    for name in videos:
        if name not in metas:
            raise DataError(f"{os.path.join(videos_dir, videos[name][0])} has no metas/{name}.txt")
    for name in metas:
        if name not in videos:
            raise DataError(f"{os.path.join(metas_dir, name)}.txt has no videos/{name}.mp4")
    if not videos:
        raise DataError(f"no videos/*.mp4 in {local_dir}")
    records = []
    for name in sorted(videos):
        embedding = None
        if embeddings is not None:
            if name not in embeddings:
                raise DataError(f"videos/{name}.mp4 has no text_embedding/{name}.npy|.safetensors "
                                f"in {local_dir}")
            embedding = _pick_embedding(emb_dir, name, embeddings[name], allow_pickle)
        records.append(WfmRecord(name, _read_meta(os.path.join(metas_dir, name + ".txt")),
                                 os.path.join(videos_dir, videos[name][0]), embedding))
    return records


def _to_arrays(obj, path: str):
    """Unpickled embedding -> ndarray or dict of ndarrays (torch tensors are converted)."""
    if isinstance(obj, dict):
        return {str(k): _to_arrays(v, path) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and len(obj) == 1:
        return _to_arrays(obj[0], path)
    if hasattr(obj, "detach"):  # torch.Tensor
        obj = obj.detach().float().cpu().numpy()
    array = np.asarray(obj)
    if array.dtype == object:
        raise DataError(f"{path}: embedding is not a numeric array")
    return array


def load_embedding(path: str, allow_pickle: bool = False):
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".npy":
            return np.load(path, allow_pickle=False)
        if ext == ".safetensors":
            from safetensors import safe_open
            with safe_open(path, framework="numpy") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if not tensors:
                raise DataError(f"{path} holds no tensors")
            return next(iter(tensors.values())) if len(tensors) == 1 else tensors
        if ext in (".pickle", ".pkl"):
            if not allow_pickle:
                raise DataError(f"{path}: pickle files can run code when loaded; set {PICKLE_FLAG}=True")
            with open(path, "rb") as f:
                return _to_arrays(pickle.load(f), path)
    except DataError:
        raise
    except Exception as e:  # numpy/safetensors/pickle raise many kinds on corrupt files
        raise BadSample(f"corrupt text embedding {path}: {e}") from e
    raise DataError(f"unsupported embedding file {path}")


def load_wfm(record: WfmRecord, rng: np.random.Generator, size_hw: tuple[int, int],
             num_frames: int, allow_pickle: bool = False) -> dict:
    sample = {"pixels": media.load_video_window(record.video_path, size_hw, num_frames, rng),
              "prompt": record.prompt}
    if record.embedding_path is not None:
        sample["text_embedding"] = load_embedding(record.embedding_path, allow_pickle)
    return sample


def wfm_loader(local_dir: str, batch_size: int, size_hw: tuple[int, int], num_frames: int, *,
               allow_pickle: bool = False, seed: int = 0, shard: Shard = Shard(),
               shuffle: bool = True, skip_bad: bool = False, num_workers: int = 0,
               prefetch: int = 2) -> Loader:
    """batch_size is this process's batch."""
    load = functools.partial(load_wfm, size_hw=tuple(size_hw), num_frames=num_frames,
                             allow_pickle=allow_pickle)
    return Loader(scan_wfm(local_dir, allow_pickle), load, batch_size, seed=seed, shard=shard,
                  shuffle=shuffle, skip_bad=skip_bad, num_workers=num_workers, prefetch=prefetch,
                  name=local_dir)


def wfm_loader_from_config(config, shard: Shard | None = None) -> Loader:
    shard = shard or process_shard()
    dataset = config.train.train_policy.dataset
    return wfm_loader(
        dataset.local_dir, local_batch_size(config.train.train_batch_per_replica, shard),
        tuple(config.policy.diffusers.inference_size), config.policy.diffusers.train_frames,
        allow_pickle=dataset.allow_pickle, seed=config.train.seed, shard=shard,
        shuffle=config.data.shuffle, skip_bad=config.data.skip_bad_samples,
        num_workers=config.data.num_workers, prefetch=config.data.prefetch_buffer_size)
