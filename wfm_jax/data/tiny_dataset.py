"""The shapes world as an image dataset in the SFT paired layout (X.png + X.json), deterministic
in the seed: coloured circles, squares and triangles, one to three, on a white or black
background. Each JSON holds the prompt and the ground truth: colour, shape, count, background
and the boxes [x0, y0, x1, y1] in pixels. The tiny recipes train on it.

    python -m wfm_jax.data.tiny_dataset DIR [--count 16] [--size 32] [--seed 0] [--split train]

Splits: `train` (60 scenes), `heldout` (12 scenes never in `train`, see shapes.heldout_scenes),
`all` (72).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from wfm_jax.data.shapes import SPLIT_SCENES, Scene, draw_scene

SPLITS = SPLIT_SCENES


def sample(index: int, seed: int, size: int, scenes: list[Scene]):
    """(image, ground-truth record) of sample `index`: the scenes cycle in an order shuffled by
    the seed, so any count covers them evenly; each sample draws from its own generator, so
    sample i is the same whatever the count."""
    order = np.random.default_rng(seed).permutation(len(scenes))
    scene = scenes[int(order[index % len(scenes)])]
    image, boxes = draw_scene(scene, size, np.random.default_rng([seed, index]))
    return image, {"prompt": scene.prompt, "colour": scene.colour, "shape": scene.shape,
                   "count": scene.count, "background": scene.background, "boxes": boxes}


def build_shapes_dataset(directory: str, count: int = 16, size: int = 32, seed: int = 0,
                         split: str = "train") -> str:
    """Write `count` samples of the split's scenes into `directory` (created; must not hold
    samples already), all-or-nothing through a temporary sibling directory."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {sorted(SPLITS)}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    scenes = SPLITS[split]()
    directory = os.path.abspath(directory)
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory} exists and is not empty")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        for i in range(count):
            image, record = sample(i, seed, size, scenes)
            stem = os.path.join(tmp, f"{i:04d}")
            image.save(stem + ".png")
            with open(stem + ".json", "w") as f:
                json.dump(record, f)
        if os.path.isdir(directory):
            os.rmdir(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def ensure_shapes_dataset(directory: str, **kwargs) -> str:
    """Build the dataset unless `directory` already holds one (safe if another process races)."""
    if os.path.isdir(directory) and os.listdir(directory):
        return os.path.abspath(directory)
    try:
        return build_shapes_dataset(directory, **kwargs)
    except (FileExistsError, OSError):
        if os.path.isdir(directory) and os.listdir(directory):  # built by someone else meanwhile
            return os.path.abspath(directory)
        raise


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wfm_jax.data.tiny_dataset",
                                description=__doc__.split("\n")[0])
    p.add_argument("directory")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", choices=sorted(SPLITS))
    args = p.parse_args(argv)
    try:
        print(build_shapes_dataset(args.directory, args.count, args.size, args.seed, args.split))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
