"""Sequential reading of WebDataset tar shards (local files or s3:// objects) from a byte offset,
as grain iterators whose state is that offset, so a restored iterator continues with exactly the
next sample.

A shard is a plain tar whose members are `<key>.<ext>`; the members of one sample are adjacent.
`__key__` is the path up to the first dot of the basename, the field the rest, lower-cased
(webdataset's rule); `__*__` meta members and non-files are skipped.

State of one shard iterator: {"offset": byte offset of the next sample's first tar header
(PAX/GNU long-name headers included), "index": samples read, "eof": bool}. At EOF nothing is
re-read (a ranged GET at the object's size is an error on S3).
"""
from __future__ import annotations

import io
import re
import tarfile
import time

import grain

from wfm_jax.data.errors import DataError
from wfm_jax.io.storage import s3 as s3lib

_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


class _RangeReader(io.RawIOBase):
    """s3://bucket/key read sequentially from `start`; a dropped stream is re-opened at the
    current position (a bounded number of times), as cosmos-rl's RetryingStream does."""

    def __init__(self, cfg: s3lib.S3Config, url: str, start: int, retries: int = 5):
        super().__init__()
        self.cfg, self.url, self.pos, self.retries = cfg, url, start, retries
        self.bucket, self.key = s3lib.split_url(url)
        self._open()

    def _open(self):
        try:
            r = s3lib.client(self.cfg).get_object(Bucket=self.bucket, Key=self.key,
                                                  Range=f"bytes={self.pos}-")
        except Exception as e:
            raise s3lib.explain(e, self.cfg, f"reading shard {self.url}", self.bucket) from None
        self.body, self.size = r["Body"], self.pos + r["ContentLength"]

    def readable(self):
        return True

    def readinto(self, b):
        for attempt in range(self.retries + 1):
            try:
                data = self.body.read(len(b))
                if not data and self.pos < self.size:
                    raise OSError("premature end of stream")
                b[:len(data)] = data
                self.pos += len(data)
                return len(data)
            except s3lib.S3Error:
                raise
            except Exception:
                if attempt == self.retries:
                    raise
                time.sleep(min(0.1 * 2 ** attempt, 5))
                self._open()
        return 0


def open_at(url: str, start: int, cfg: s3lib.S3Config | None):
    """A buffered binary stream of `url` from byte `start`, and the total size."""
    if s3lib.is_s3_url(url):
        raw = _RangeReader(cfg, url, start)
        return io.BufferedReader(raw, 1 << 20), raw.size
    try:
        f = open(url, "rb")
    except OSError as e:
        raise DataError(f"cannot open shard {url}: {e.strerror}") from None
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(start)
    return f, size


def read_range(url: str, start: int, length: int, cfg: s3lib.S3Config | None) -> bytes:
    """`length` bytes of `url` at `start` (one ranged GET on S3)."""
    if s3lib.is_s3_url(url):
        bucket, key = s3lib.split_url(url)
        try:
            return s3lib.client(cfg).get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")["Body"].read()
        except Exception as e:
            raise s3lib.explain(e, cfg, f"reading {url}", bucket) from None
    with open(url, "rb") as f:
        f.seek(start)
        return f.read(length)


def bad_sample(url: str, index: int, message: str) -> dict:
    """What a broken shard yields under skip_bad: decoding it raises BadSample(message)."""
    return {"__key__": "", "__url__": url, "__index__": index, "__bad__": message}


class TarShardIterator(grain.DatasetIterator):
    """Samples {"__key__", "__url__", "__index__", <ext>: bytes, ...} of one shard, in order;
    with `locate`, also {"__members__": {ext: (data offset, size)}} (random access later)."""

    def __init__(self, url: str, cfg: s3lib.S3Config | None, locate: bool = False,
                 skip_bad: bool = False):
        super().__init__()
        self.url, self.cfg, self.locate, self.skip_bad = url, cfg, locate, skip_bad
        self._state = {"offset": 0, "index": 0, "eof": False}
        self._tar = None
        self._pending = None

    def _open(self):
        self._base = self._state["offset"]
        self._stream, self._size = open_at(self.url, self._base, self.cfg)
        try:
            self._tar = tarfile.open(fileobj=self._stream, mode="r|")
        except tarfile.ReadError as e:
            self._stream.close()
            raise DataError(f"shard {self.url} is not a tar file (at byte {self._base}: {e})") from None
        self._members, self._pending = iter(self._tar), None

    def _next_member(self):
        while True:
            try:
                ti = next(self._members, None)
                if ti is None:
                    return None
                if not ti.isreg() or _META_RE.match(ti.name):
                    continue
                m = _KEY_RE.match(ti.name)
                if m is None:
                    continue
                data = self._tar.extractfile(ti).read()
            except (tarfile.TarError, EOFError, OSError) as e:
                raise DataError(f"shard {self.url} is not a readable tar after byte "
                                f"{self._base}: {e}") from None
            self._tar.members = []  # streaming: keep no member list
            where = (self._base + ti.offset_data, ti.size)
            return m.group(1), m.group(2).lower(), data, self._base + ti.offset, where

    def __next__(self):
        if self._state["eof"]:
            raise StopIteration
        try:
            return self._read_sample()
        except DataError as e:  # not a tar / cut short: with skip_bad, one bad sample ends it
            if not self.skip_bad:
                raise
            index = self._state["index"]
            self._finish()
            return bad_sample(self.url, index, str(e))

    def _read_sample(self):
        if self._tar is None:
            self._open()
        first = self._pending or self._next_member()
        if first is None:
            self._finish()
            raise StopIteration
        key = first[0]
        sample = {"__key__": key, "__url__": self.url, "__index__": self._state["index"]}
        members = {}
        nxt = first
        while nxt is not None and nxt[0] == key:
            sample[nxt[1]] = nxt[2]
            members[nxt[1]] = nxt[4]
            nxt = self._next_member()
        if self.locate:
            sample["__members__"] = members
        self._pending = nxt
        self._state = {"offset": nxt[3] if nxt else self._size,
                       "index": self._state["index"] + 1, "eof": nxt is None}
        if nxt is None:
            self._finish()
        return sample

    def _finish(self):
        self._state = {**self._state, "eof": True}
        if self._tar is not None:
            self._stream.close()
            self._tar = None

    def get_state(self):
        return dict(self._state)

    def set_state(self, state):
        if self._tar is not None:
            self._stream.close()
        self._state = {"offset": int(state["offset"]), "index": int(state["index"]),
                       "eof": bool(state["eof"])}
        self._tar, self._pending = None, None

    def close(self):
        if self._tar is not None:
            self._stream.close()
            self._tar = None


class SplitShardIterator(grain.DatasetIterator):
    """cosmos-rl's split layout: one tar tree per data key (`root/<key>/<path>`), zipped sample
    by sample; the fields of key `k` land under `k` ({"video": {"mp4": ...}, "metas": {...}}).
    A key whose sample names disagree is a DataError naming both."""

    def __init__(self, root: str, path: str, keys: tuple, cfg: s3lib.S3Config | None,
                 skip_bad: bool = False):
        super().__init__()
        self.url = f"{root}/{{{','.join(keys)}}}/{path}"
        self._its = {k: TarShardIterator(f"{root}/{k}/{path}", cfg, skip_bad=skip_bad)
                     for k in keys}

    def __next__(self):
        parts = {}
        for k, it in self._its.items():
            try:
                parts[k] = next(it)
            except StopIteration:
                if parts:
                    raise DataError(f"{it.url} ends before the other keys' shards "
                                    f"(after {it.get_state()['index']} samples)") from None
                raise
            if "__bad__" in parts[k]:  # a broken key shard ends the whole zipped shard
                for other in self._its.values():
                    other._finish()
                return parts[k]
        keys = {p["__key__"] for p in parts.values()}
        if len(keys) > 1:
            raise DataError(f"split shards disagree at sample {parts[next(iter(parts))]['__index__']}: "
                            + ", ".join(f"{p['__url__']} has '{p['__key__']}'" for p in parts.values()))
        first = next(iter(parts.values()))
        sample = {"__key__": first["__key__"], "__url__": self.url, "__index__": first["__index__"]}
        for k, p in parts.items():
            sample[k] = {e: v for e, v in p.items() if not e.startswith("__")}
        return sample

    def get_state(self):
        return {k: it.get_state() for k, it in self._its.items()}

    def set_state(self, state):
        for k, it in self._its.items():
            it.set_state(state[k])

    def close(self):
        for it in self._its.values():
            it.close()


class ShardDataset(grain.IterDataset):
    """One shard as a grain IterDataset (paired layout: `keys` empty; split layout: the keys)."""

    def __init__(self, url: str, cfg: s3lib.S3Config | None, root: str = "", keys: tuple = (),
                 skip_bad: bool = False):
        super().__init__()
        self.url, self.cfg, self.root, self.keys = url, cfg, root, tuple(keys)
        self.skip_bad = skip_bad

    def __iter__(self):
        if self.keys:
            return SplitShardIterator(self.root, self.url, self.keys, self.cfg, self.skip_bad)
        return TarShardIterator(self.url, self.cfg, skip_bad=self.skip_bad)
