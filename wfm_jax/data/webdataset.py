"""WebDataset tar shards (local or s3://) as a resumable grain stream for SFT (and, indexed, for
DDRL's data loss).

Where the shards are (train.train_policy.dataset.local_dir):
    a local directory or an s3://bucket/prefix holding *.tar shards (listed recursively, sorted),
    or a cosmos-rl wdinfo JSON ({"root", "data_list": [tar paths]}), local or on S3.
Sample layouts:
    paired   one tree of tars, each sample `X.json` ({"prompt": ...}) + `X.jpg|jpeg|png|webp|mp4`;
    split    cosmos-rl's world-model layout: one tar tree per data key (`root/<key>/<path>`, e.g.
             video/ metas/ t5_xxl/), zipped sample by sample. Used when dataset.wds_keys is set,
             or when the tars all lie one directory down with the same paths under each key.

Stream (per process):
    shard list -> shuffle(seed), a new order each epoch -> repeat -> [process_index::count]
    -> open cycle_length shards at once, interleaved -> shuffle windows of shuffle_window samples
    -> decode (rng per shard + sample index)
    -> [worker processes] -> drop + count bad samples -> batch
The iterator state is grain's: per open shard the byte offset of its next sample, so a restored
loader reads exactly the batches the uninterrupted one would. It is valid only for the same shard
list, seed, process count, cycle_length, shuffle_window and num_workers; another is refused.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import zlib

import grain
import numpy as np

from wfm_jax.data import media
from wfm_jax.data.errors import BadSample, DataError
from wfm_jax.data.loader import Loader, Shard, local_batch_size, process_shard, stack_batch
from wfm_jax.data.tar_stream import ShardDataset, TarShardIterator, read_range
from wfm_jax.data.window_shuffle import WindowShuffleIterDataset
from wfm_jax.io.storage import s3 as s3lib

MEDIA_KEYS = ("video", "videos", "images", "image")          # split layout: the pixels
TEXT_KEYS = ("metas", "captions", "text")                    # split layout: the prompt
EMBED_KEYS = ("t5_xxl", "umt5_xxl", "text_embedding", "text_embeddings")
PROMPT_FIELDS = ("prompt", "caption", "text")                # in a JSON, in order of preference
LOCATION_KEY = "train.train_policy.dataset.local_dir"


@dataclasses.dataclass(frozen=True)
class Shards:
    root: str               # local dir or s3://bucket/prefix (no trailing slash)
    paths: tuple            # tar paths relative to root (split layout: relative to root/<key>)
    keys: tuple = ()        # split layout's data keys; () for the paired layout
    cfg: s3lib.S3Config | None = None

    def url(self, path: str) -> str:
        return f"{self.root}/{path}"

    def fingerprint(self) -> int:
        return zlib.crc32(json.dumps([self.root, list(self.paths), list(self.keys)]).encode())


def is_webdataset(location: str) -> bool:
    """s3:// URLs, wdinfo JSON files and local dirs holding *.tar files (at any depth)."""
    if s3lib.is_s3_url(location):
        return True
    if os.path.isfile(location) and location.endswith(".json"):
        return True
    if os.path.isdir(location):
        return any(f.endswith(".tar") for _, _, fs in os.walk(location) for f in fs)
    return False


def _list_tars(root: str, cfg) -> list[str]:
    """Every *.tar under root, relative to it, sorted."""
    if not s3lib.is_s3_url(root):
        return sorted(os.path.relpath(os.path.join(d, f), root)
                      for d, _, fs in os.walk(root) for f in fs if f.endswith(".tar"))
    bucket, prefix = s3lib.split_url(root)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    out = []
    try:
        pages = s3lib.client(cfg).get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                            Prefix=prefix)
        for page in pages:
            out += [o["Key"][len(prefix):] for o in page.get("Contents", [])
                    if o["Key"].endswith(".tar")]
    except Exception as e:
        raise s3lib.explain(e, cfg, f"listing {root}/ ({LOCATION_KEY})", bucket) from None
    return sorted(out)


def _read_json(location: str, cfg) -> dict:
    try:
        if s3lib.is_s3_url(location):
            bucket, key = s3lib.split_url(location)
            try:
                body = s3lib.client(cfg).get_object(Bucket=bucket, Key=key)["Body"].read()
            except Exception as e:
                raise s3lib.explain(e, cfg, f"reading {location}", bucket) from None
        else:
            with open(location, "rb") as f:
                body = f.read()
        info = json.loads(body)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read wdinfo {location}: {e}") from None
    if not isinstance(info, dict) or not isinstance(info.get("data_list"), list):
        raise DataError(f'wdinfo {location} has no "data_list" of tar paths')
    return info


def _split_keys(root: str, tars: list[str], keys: tuple) -> tuple[tuple, list[str]]:
    """(keys, paths) of the split layout from a listing of root: every key dir must hold the
    same tar paths."""
    by_key: dict[str, set] = {}
    for t in tars:
        key, _, rest = t.partition("/")
        if rest:
            by_key.setdefault(key, set()).add(rest)
    keys = tuple(keys) or tuple(sorted(by_key))
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise DataError(f"{root} has no {missing[0]}/ shards (dataset.wds_keys={list(keys)})")
    paths = by_key[keys[0]]
    for k in keys[1:]:
        if by_key[k] != paths:
            odd = sorted(paths ^ by_key[k])[0]
            raise DataError(f"split shards differ between {root}/{keys[0]}/ and {root}/{k}/ "
                            f"(e.g. {odd})")
    return keys, sorted(paths)


def resolve_shards(location: str, keys=(), cfg: s3lib.S3Config | None = None) -> Shards:
    """The shard list of `location` (see the module doc); DataError/S3Error when there is none."""
    location = location.rstrip("/")
    if s3lib.is_s3_url(location) and cfg is None:
        cfg = s3lib.s3_config_from_env()
    keys = tuple(keys or ())
    if location.endswith(".json"):
        info = _read_json(location, cfg)
        base = location.rsplit("/", 1)[0]
        root = str(info.get("root") or base).rstrip("/")
        if s3lib.is_s3_url(location) and not s3lib.is_s3_url(root):
            root = f"s3://{s3lib.split_url(location)[0]}/{root.lstrip('/')}"
        elif not s3lib.is_s3_url(root) and not os.path.isabs(root):
            root = os.path.join(base, root)
        paths = [str(p) for p in info["data_list"]]
        if not paths:
            raise DataError(f"wdinfo {location} lists no tar shards")
        if not keys and not any(t in paths for t in _list_tars(root, cfg)):
            keys, _ = _split_keys(root, _list_tars(root, cfg), ())
        return Shards(root, tuple(paths), keys, cfg)
    if not s3lib.is_s3_url(location) and not os.path.isdir(location):
        raise DataError(f"dataset not found: '{location}' ({LOCATION_KEY})")
    tars = _list_tars(location, cfg)
    if not tars:
        raise DataError(f"no *.tar shards under {location} ({LOCATION_KEY})")
    top = [t for t in tars if "/" not in t]
    if top and not keys:
        return Shards(location, tuple(top), (), cfg)
    keys, paths = _split_keys(location, tars, keys)
    return Shards(location, tuple(paths), keys, cfg)


# ----------------------------------------------------------------------------- decoding

def _prompt_of(fields: dict, where: str) -> str:
    """The prompt of a sample's text fields: json {"prompt"|"caption"|"text"} or txt."""
    if "json" in fields:
        try:
            meta = json.loads(fields["json"])
        except ValueError as e:
            raise BadSample(f"{where}: .json is not JSON ({e})") from None
        for name in PROMPT_FIELDS:
            if isinstance(meta, dict) and isinstance(meta.get(name), str):
                return meta[name]
        raise BadSample(f'{where}: .json has no "prompt"')
    for ext in ("txt", "text"):
        if ext in fields:
            return fields[ext].decode("utf-8", "replace").strip()
    raise BadSample(f"{where}: no .json (prompt)")


def _media_of(fields: dict, where: str) -> tuple[str, bytes]:
    found = [e for e in fields if "." + e in media.IMAGE_EXTS + media.VIDEO_EXTS]
    if not found:
        raise BadSample(f"{where}: no media (.jpg|.jpeg|.png|.webp|.mp4)")
    if len(found) > 1:
        raise BadSample(f"{where}: several media fields ({', '.join(sorted(found))})")
    return found[0], fields[found[0]]


def _embedding_of(fields: dict, where: str, allow_pickle: bool):
    if "npy" in fields:
        import io
        return np.load(io.BytesIO(fields["npy"]), allow_pickle=False)
    for ext in ("pickle", "pkl"):
        if ext in fields:
            if not allow_pickle:
                raise DataError(f"{where}: pickled text embeddings run code when loaded; set "
                                f"train.train_policy.dataset.allow_pickle=True to read them")
            value = pickle.loads(fields[ext])
            return {k: np.asarray(v) for k, v in value.items()} if isinstance(value, dict) \
                else np.asarray(value)
    raise BadSample(f"{where}: no .npy or .pickle text embedding")


class Decode:
    """Picklable (worker processes): raw sample -> {"pixels", "prompt"[, "text_embedding"]}, or
    a _Bad marker when skip_bad and the sample is bad."""

    def __init__(self, size_hw, num_frames: int, seed: int, skip_bad: bool, allow_pickle: bool):
        self.size_hw, self.num_frames, self.seed = tuple(size_hw), int(num_frames), int(seed)
        self.skip_bad, self.allow_pickle = skip_bad, allow_pickle

    def __call__(self, sample: dict):
        if not self.skip_bad:
            return self.decode(sample)
        try:
            return self.decode(sample)
        except BadSample as e:
            from wfm_jax.data.loader import _Bad
            return _Bad(str(e))

    def decode(self, sample: dict) -> dict:
        if "__bad__" in sample:  # a broken shard, skipped (skip_bad) after its good samples
            raise BadSample(sample["__bad__"])
        where = f"shard {sample['__url__']} sample '{sample['__key__']}'"
        rng = np.random.default_rng([self.seed, zlib.crc32(sample["__url__"].encode()),
                                     sample["__index__"]])
        split = {k: v for k, v in sample.items() if isinstance(v, dict)}
        if split:
            media_key = next((k for k in MEDIA_KEYS if k in split), None)
            text_key = next((k for k in TEXT_KEYS if k in split), None)
            if media_key is None or text_key is None:
                raise DataError(f"split layout keys {sorted(split)} need one of {MEDIA_KEYS} and "
                                f"one of {TEXT_KEYS} (dataset.wds_keys)")
            fields, text = split[media_key], split[text_key]
        else:
            fields = text = sample
        out = {"prompt": _prompt_of(text, where)}
        ext, data = _media_of(fields, where)
        name = f"{sample['__url__']}:{sample['__key__']}.{ext}"
        if "." + ext in media.VIDEO_EXTS:
            out["pixels"] = media.load_video_bytes(data, self.size_hw, self.num_frames, rng, name)
        else:
            out["pixels"] = media.load_image_bytes(data, self.size_hw, name)
        embed_key = next((k for k in EMBED_KEYS if k in split), None)
        if embed_key is not None:
            out["text_embedding"] = _embedding_of(split[embed_key], where, self.allow_pickle)
        return out


class _OpenShard:
    """Picklable: shard path -> its IterDataset."""

    def __init__(self, shards: Shards, skip_bad: bool):
        self.shards, self.skip_bad = shards, skip_bad

    def __call__(self, path: str):
        s = self.shards
        if s.keys:
            return ShardDataset(path, s.cfg, root=s.root, keys=s.keys, skip_bad=self.skip_bad)
        return ShardDataset(s.url(path), s.cfg, skip_bad=self.skip_bad)


# ----------------------------------------------------------------------------- the loader

class WebDatasetLoader(Loader):
    """Loader (same interface: iterate, state(), restore(), close(), skipped) over shards."""

    def __init__(self, shards: Shards, decode: Decode, batch_size: int, *, seed: int = 0,
                 shard: Shard = Shard(), shuffle: bool = True, cycle_length: int = 4,
                 window: int = 0, num_workers: int = 0, batch_fn=stack_batch):
        if batch_size < 1:
            raise DataError(f"batch size must be >= 1, got {batch_size}")
        if len(shards.paths) < shard.count:
            raise DataError(f"{shards.root} has {len(shards.paths)} shards, fewer than the "
                            f"{shard.count} processes reading them")
        self.name, self.shard = shards.root, shard
        self.num_records = 100_000  # bound on bad samples in a row before "all bad"
        self.dataset_size = None  # the shards are streamed, never counted
        self.skipped, self.bad_files, self._bad_in_a_row = 0, [], 0
        self._source = {"shards": shards.fingerprint(), "seed": int(seed), "shuffle": bool(shuffle),
                        "processes": shard.count, "process": shard.index,
                        "cycle_length": int(cycle_length), "window": int(window),
                        "num_workers": int(num_workers)}
        ds = grain.MapDataset.source(list(shards.paths))
        if shuffle:
            ds = ds.shuffle(seed=seed)  # grain redraws the order for every repeat (epoch)
        ds = ds.repeat()[shard.index::shard.count].map(_OpenShard(shards, decode.skip_bad))
        it_ds = grain.experimental.InterleaveIterDataset(ds, cycle_length=max(1, cycle_length))
        if shuffle and window > 1:  # raw samples (bytes): decoded only when they leave
            it_ds = WindowShuffleIterDataset(it_ds, window, seed)
        self._start(it_ds.map(decode), batch_size, batch_fn, num_workers)

    def state(self) -> dict:
        return {**super().state(), "source": dict(self._source)}

    def restore(self, state: dict) -> None:
        saved = state.get("source")
        if saved is None:
            raise DataError(f"the checkpoint's data state is not a WebDataset position; was it "
                            f"written with another {LOCATION_KEY}?")
        changed = [k for k in self._source if saved.get(k) != self._source[k]]
        if changed:
            what = ", ".join(f"{k} {saved.get(k)} -> {self._source[k]}" for k in changed)
            raise DataError(f"cannot resume the WebDataset position: the shard stream changed "
                            f"({what}); resume with the same shards, train.seed, process count, "
                            f"data.cycle_length, data.shuffle_window and data.num_workers")
        super().restore(state)


def webdataset_loader_from_config(config, shard: Shard | None = None) -> WebDatasetLoader:
    shard = shard or process_shard()
    ds, d = config.train.train_policy.dataset, config.policy.diffusers
    shards = resolve_shards(ds.local_dir, ds.wds_keys)
    decode = Decode(tuple(d.inference_size), d.train_frames, config.train.seed,
                    config.data.skip_bad_samples, ds.allow_pickle)
    return WebDatasetLoader(shards, decode, local_batch_size(config.train.train_batch_per_replica,
                                                             shard),
                            seed=config.train.seed, shard=shard, shuffle=config.data.shuffle,
                            cycle_length=config.data.cycle_length,
                            window=config.data.shuffle_window, num_workers=config.data.num_workers)


# ----------------------------------------------------------------------------- indexed records

@dataclasses.dataclass(frozen=True)
class TarRecord:
    """One paired sample located inside a shard: its prompt and where its media bytes lie, so
    it can be read again later with one ranged read (DDRL's data loss)."""
    prompt: str
    url: str
    offset: int
    size: int
    media_path: str          # shard:key.ext, for messages
    is_video: bool
    cfg: s3lib.S3Config | None = dataclasses.field(default=None, repr=False, compare=False)


def index_records(location: str, cfg: s3lib.S3Config | None = None) -> list[TarRecord]:
    """Every sample of the paired-layout shards at `location`, in shard order (reads the shards
    once; a sample missing its .json or media is a DataError naming shard and key)."""
    shards = resolve_shards(location, (), cfg)
    if shards.keys:
        raise DataError(f"{location} is in the split layout ({', '.join(shards.keys)}); RL data "
                        f"needs the paired layout (X.json + X.jpg|png in each tar)")
    records = []
    for path in shards.paths:
        it = TarShardIterator(shards.url(path), shards.cfg, locate=True)
        for sample in it:
            where = f"shard {sample['__url__']} sample '{sample['__key__']}'"
            prompt = _prompt_of(sample, where)
            ext, _ = _media_of(sample, where)
            offset, size = sample["__members__"][ext]
            records.append(TarRecord(prompt, sample["__url__"], offset, size,
                                     f"{sample['__url__']}:{sample['__key__']}.{ext}",
                                     "." + ext in media.VIDEO_EXTS, shards.cfg))
    if not records:
        raise DataError(f"no samples in the shards at {location}")
    return records


def load_record_image(record, size_hw) -> np.ndarray:
    """The image of a paired record: a file (PairedRecord) or a span of a shard (TarRecord)."""
    return load_record_media(record, size_hw)


def load_record_media(record, size_hw, num_frames: int = 1,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """A record's image (H, W, 3), or a window of `num_frames` frames of its video
    (T, H, W, 3), uint8: a file (PairedRecord, WfmRecord) or a span of a shard
    (TarRecord). rng picks the window's start (a BadSample names a short or corrupt clip)."""
    size_hw = tuple(size_hw)
    if record.is_video and rng is None:
        raise ValueError("a video record needs an rng for its frame window")
    if hasattr(record, "load"):  # generated in memory (wfm_jax.data.mock)
        return record.load(size_hw, num_frames, rng)
    if isinstance(record, TarRecord):
        data = read_range(record.url, record.offset, record.size, record.cfg)
        if record.is_video:
            return media.load_video_bytes(data, size_hw, num_frames, rng, record.media_path)
        return media.load_image_bytes(data, size_hw, record.media_path)
    if record.is_video:
        return media.load_video_window(record.media_path, size_hw, num_frames, rng)
    return media.load_image(record.media_path, size_hw)
