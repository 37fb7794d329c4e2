"""SFT paired layout (cosmos-rl): `local_dir/X.json` holding {"prompt": ...} next to `X.jpg|png`
(an image) or `X.mp4` (a video) with the same basename.

Batches: {"pixels": uint8 (B, H, W, 3) for images or (B, T, H, W, 3) for videos (the encoder
maps them to [-1, 1] on the device), "prompt": list[str]}. All JSONs are read up front, so a
missing "prompt" fails before training.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np

from wfm_jax.data import media
from wfm_jax.data.errors import DataError
from wfm_jax.data.loader import Loader, Shard, local_batch_size, process_shard


@dataclasses.dataclass(frozen=True)
class PairedRecord:
    prompt: str
    media_path: str
    is_video: bool


def _read_prompt(json_path: str) -> str:
    try:
        with open(json_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {json_path}: {e}") from e
    if not isinstance(meta, dict) or "prompt" not in meta:
        raise DataError(f'{json_path} has no "prompt"')
    if not isinstance(meta["prompt"], str):
        raise DataError(f'{json_path}: "prompt" must be a string, got {type(meta["prompt"]).__name__}')
    return meta["prompt"]


def scan_paired(local_dir: str) -> list[PairedRecord]:
    """Records sorted by basename; every X.json needs exactly one X.<image|mp4>."""
    if not local_dir or not os.path.isdir(local_dir):
        raise DataError(f"dataset dir not found: '{local_dir}' (train.train_policy.dataset.local_dir)")
    names = sorted(os.listdir(local_dir))
    by_stem: dict[str, list[str]] = {}
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext.lower() in media.IMAGE_EXTS + media.VIDEO_EXTS:
            by_stem.setdefault(stem, []).append(name)
    records = []
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext != ".json":
            continue
        json_path = os.path.join(local_dir, name)
        prompt = _read_prompt(json_path)
        found = by_stem.get(stem, [])
        if not found:
            raise DataError(f"{json_path} has no matching media ({stem}.jpg|.png|.mp4)")
        if len(found) > 1:
            raise DataError(f"{json_path} matches several media files: {', '.join(found)}")
        is_video = os.path.splitext(found[0])[1].lower() in media.VIDEO_EXTS
        records.append(PairedRecord(prompt, os.path.join(local_dir, found[0]), is_video))
    if not records:
        raise DataError(f"no X.json + X.jpg|png|mp4 samples in {local_dir}")
    kinds = {r.is_video for r in records}
    if len(kinds) > 1:
        video = next(r for r in records if r.is_video).media_path
        image = next(r for r in records if not r.is_video).media_path
        raise DataError(f"{local_dir} mixes videos and images ({video}, {image}); use one kind")
    return records


def load_paired(record: PairedRecord, rng: np.random.Generator, size_hw: tuple[int, int],
                num_frames: int) -> dict:
    if record.is_video:
        pixels = media.load_video_window(record.media_path, size_hw, num_frames, rng)
    else:
        pixels = media.load_image(record.media_path, size_hw)
    return {"pixels": pixels, "prompt": record.prompt}


def paired_loader(local_dir: str, batch_size: int, size_hw: tuple[int, int], *, num_frames: int = 1,
                  seed: int = 0, shard: Shard = Shard(), shuffle: bool = True,
                  skip_bad: bool = False, num_workers: int = 0, prefetch: int = 2) -> Loader:
    """batch_size is this process's batch."""
    load = functools.partial(load_paired, size_hw=tuple(size_hw), num_frames=num_frames)
    return Loader(scan_paired(local_dir), load, batch_size, seed=seed, shard=shard, shuffle=shuffle,
                  skip_bad=skip_bad, num_workers=num_workers, prefetch=prefetch, name=local_dir)


def paired_loader_from_config(config, shard: Shard | None = None) -> Loader:
    """Keys: train.train_policy.dataset.local_dir, train.train_batch_per_replica (global),
    train.seed, policy.diffusers.{inference_size, train_frames}, data.*."""
    shard = shard or process_shard()
    return paired_loader(
        config.train.train_policy.dataset.local_dir,
        local_batch_size(config.train.train_batch_per_replica, shard),
        tuple(config.policy.diffusers.inference_size),
        num_frames=config.policy.diffusers.train_frames, seed=config.train.seed, shard=shard,
        shuffle=config.data.shuffle, skip_bad=config.data.skip_bad_samples,
        num_workers=config.data.num_workers, prefetch=config.data.prefetch_buffer_size)
