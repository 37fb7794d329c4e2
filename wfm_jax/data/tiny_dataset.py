"""A small generated image dataset in the SFT paired layout (X.png + X.json with "prompt"):
coloured shapes on a plain background, deterministic in the seed. The tiny recipes train on it.

    python -m wfm_jax.data.tiny_dataset DIR [--count 16] [--size 32] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220),
           "yellow": (235, 210, 40)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15)}
SHAPES = ("circle", "square", "triangle")


def _draw(shape: str, colour, background, size: int, rng: np.random.Generator) -> Image.Image:
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    half = size * rng.uniform(0.22, 0.38)
    cx, cy = size / 2 + rng.uniform(-0.1, 0.1) * size, size / 2 + rng.uniform(-0.1, 0.1) * size
    box = (cx - half, cy - half, cx + half, cy + half)
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)], fill=colour)
    return image


def build_shapes_dataset(directory: str, count: int = 16, size: int = 32, seed: int = 0) -> str:
    """Write `count` samples into `directory` (created; must not hold samples already),
    all-or-nothing through a temporary sibling directory."""
    directory = os.path.abspath(directory)
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory} exists and is not empty")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    rng = np.random.default_rng(seed)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        for i in range(count):
            shape = SHAPES[i % len(SHAPES)]
            colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
            background = list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]
            image = _draw(shape, COLOURS[colour], BACKGROUNDS[background], size, rng)
            stem = os.path.join(tmp, f"{i:04d}")
            image.save(stem + ".png")
            with open(stem + ".json", "w") as f:
                json.dump({"prompt": f"a {colour} {shape} on a {background} background"}, f)
        if os.path.isdir(directory):
            os.rmdir(directory)
        os.replace(tmp, directory)
    except BaseException:
        import shutil
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
    args = p.parse_args(argv)
    try:
        print(build_shapes_dataset(args.directory, args.count, args.size, args.seed))
    except (FileExistsError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
