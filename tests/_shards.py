"""Small WebDataset shards for tests: paired (X.json + X.png) and cosmos-rl's split layout."""
from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
from PIL import Image


def png(seed: int, size: int = 16) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def write_tar(path: str, members: list[tuple[str, bytes]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def paired_shards(root: str, shards: int = 4, per_shard: int = 4, size: int = 16,
                  image_of=None) -> list[str]:
    """shard_000i.tar with samples s<i>_<j>: prompt 'sample i j' and a random PNG; returns the
    prompts in write order."""
    prompts = []
    for i in range(shards):
        members = []
        for j in range(per_shard):
            key, prompt = f"s{i:02d}_{j:03d}", f"sample {i} {j}"
            members += [(f"{key}.json", json.dumps({"prompt": prompt}).encode()),
                        (f"{key}.png", image_of(i, j) if image_of else png(100 * i + j, size))]
            prompts.append(prompt)
        write_tar(os.path.join(root, f"shard_{i:04d}.tar"), members)
    return prompts


def split_shards(root: str, shards: int = 3, per_shard: int = 3, size: int = 16) -> list[str]:
    """cosmos-rl's layout: root/{images,metas,t5_xxl}/part_i.tar, zipped by sample key."""
    prompts = []
    for i in range(shards):
        images, metas, embeds = [], [], []
        for j in range(per_shard):
            key, prompt = f"id_{i}_{j}", f"split {i} {j}"
            images.append((f"{key}.png", png(1000 + 10 * i + j, size)))
            metas.append((f"{key}.json", json.dumps({"caption": prompt}).encode()))
            buf = io.BytesIO()
            np.save(buf, np.full((2, 4), i * 10 + j, np.float32))
            embeds.append((f"{key}.npy", buf.getvalue()))
            prompts.append(prompt)
        for name, members in (("images", images), ("metas", metas), ("t5_xxl", embeds)):
            write_tar(os.path.join(root, name, f"part_{i}.tar"), members)
    return prompts


def upload_dir(client, local: str, bucket: str, prefix: str) -> None:
    for d, _, files in os.walk(local):
        for f in files:
            path = os.path.join(d, f)
            client.upload_file(path, bucket, f"{prefix}/{os.path.relpath(path, local)}")


def shards_from_paired_dir(src: str, out: str, per_shard: int = 4) -> int:
    """Pack a paired dir (X.json + X.png) into shard_i.tar files of per_shard samples each."""
    stems = sorted(f[:-5] for f in os.listdir(src) if f.endswith(".json"))
    for i in range(0, len(stems), per_shard):
        members = []
        for stem in stems[i:i + per_shard]:
            for ext in ("json", "png"):
                with open(os.path.join(src, f"{stem}.{ext}"), "rb") as f:
                    members.append((f"{stem.replace('.', '_')}.{ext}", f.read()))
        write_tar(os.path.join(out, f"shard_{i // per_shard:04d}.tar"), members)
    return (len(stems) + per_shard - 1) // per_shard
