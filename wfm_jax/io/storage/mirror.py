"""Directory trees mirrored to S3 with a commit marker written last.

S3 has no rename, so a tree is uploaded in place and `<base>/_COMMIT.json` (the file list with
sizes) is PUT after every file: a single PUT is atomic, so a reader that trusts only trees with
the marker never sees a half upload. Deleting removes the marker first for the same reason.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from wfm_jax.io.storage import s3 as s3lib

COMMIT = "_COMMIT.json"


def _xfer():
    from boto3.s3.transfer import TransferConfig
    return TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20,
                          max_concurrency=4)


def local_files(directory: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), directory)
                  for d, _, fs in os.walk(directory) for f in fs)


def upload_tree(cfg: s3lib.S3Config, local_dir: str, bucket: str, base: str,
                extra: dict | None = None) -> dict:
    """Upload every file of local_dir to s3://bucket/base/<rel>, then the commit marker.
    Returns the manifest. Any failure raises before the marker is written."""
    client = s3lib.client(cfg)
    base = base.strip("/")
    files = local_files(local_dir)

    def put(rel):
        path = os.path.join(local_dir, rel)
        client.upload_file(path, bucket, f"{base}/{rel}", Config=_xfer())
        return rel, os.path.getsize(path)

    pool = ThreadPoolExecutor(4)
    try:
        sizes = dict(pool.map(put, files))
    finally:  # on a failure, don't start the rest (each would retry against a dead server)
        pool.shutdown(wait=True, cancel_futures=True)
    manifest = {"format": 1, "files": sizes, "time": time.time(), **(extra or {})}
    client.put_object(Bucket=bucket, Key=f"{base}/{COMMIT}", Body=json.dumps(manifest).encode())
    return manifest


def committed(cfg: s3lib.S3Config, bucket: str, parent: str) -> list[str]:
    """Names of the sub-trees of s3://bucket/parent/ that carry a commit marker."""
    client = s3lib.client(cfg)
    parent = parent.strip("/") + "/"
    names = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=parent):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(parent):]
            name, _, rest = rel.partition("/")
            if rest == COMMIT:
                names.append(name)
    return names


def download_tree(cfg: s3lib.S3Config, bucket: str, base: str, local_dir: str) -> None:
    """The committed tree s3://bucket/base into local_dir, complete or not at all (written to a
    temporary sibling, sizes checked against the marker, then renamed)."""
    client = s3lib.client(cfg)
    base = base.strip("/")
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"{base}/{COMMIT}")["Body"].read())
    tmp = f"{local_dir}.download-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for rel, size in manifest["files"].items():
        path = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        client.download_file(bucket, f"{base}/{rel}", path, Config=_xfer())
        if os.path.getsize(path) != size:
            shutil.rmtree(tmp, ignore_errors=True)
            raise s3lib.S3Error(f"s3://{bucket}/{base}/{rel} has {os.path.getsize(path)} bytes, "
                                f"its commit marker says {size}")
    os.makedirs(os.path.dirname(os.path.abspath(local_dir)), exist_ok=True)
    os.replace(tmp, local_dir)


def delete_tree(cfg: s3lib.S3Config, bucket: str, base: str) -> int:
    """Un-commit s3://bucket/base (marker first), then delete its objects; returns the count."""
    client = s3lib.client(cfg)
    base = base.strip("/") + "/"
    client.delete_object(Bucket=bucket, Key=f"{base}{COMMIT}")
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=base) for o in page.get("Contents", [])]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k}
                                                                 for k in keys[i:i + 1000]]})
    return len(keys)
