"""The shapes world as an image dataset in the SFT paired layout (X.png + X.json), deterministic
in the seed: coloured circles, squares and triangles, one to three, on a white or black
background. Each JSON holds the prompt and the ground truth: colour, shape, count, background
and the boxes [x0, y0, x1, y1] in pixels. The tiny recipes train on it.

    python -m wfm_jax.data.tiny_dataset DIR [--count 16] [--size 32] [--seed 0] [--split train]
                                            [--frames 0] [--layout random] [--small P]

--frames N > 0 writes videos instead (X.mp4 + X.json, for the video recipes): the scene drifts
one pixel per frame (sample i in DIRECTIONS[i % 4]), wrapping around (the background is
uniform, so the wrap leaves no seam); the JSON adds the direction and the frame count, its
boxes are those of frame 0.

Splits: `train` (60 scenes), `heldout` (12 scenes never in `train`, see shapes.heldout_scenes),
`all` (72); `train_sized` and `heldout_sized`: those scenes asked small and large (grammar.SIZES).

--layout fixed draws every scene of a count at the same places (grammar.FIXED_LAYOUTS); --small P
draws each unsized scene small with probability P and large otherwise, its caption without the
size word. The pretrained base trains on `--layout fixed --small 0.3` (train.pretrain).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from wfm_jax.worlds.shapes.grammar import LAYOUTS, SIZES, SPLIT_SCENES, Scene, draw_scene

SPLITS = SPLIT_SCENES


def scene_at(index: int, seed: int, scenes: list[Scene]) -> Scene:
    """The scene of sample `index`: the scenes cycle in an order shuffled by the seed, so any
    count covers them evenly."""
    order = np.random.default_rng(seed).permutation(len(scenes))
    return scenes[int(order[index % len(scenes)])]


def record_of(scene: Scene, boxes) -> dict:
    """The ground-truth record of a drawing of `scene` (its prompt, attributes and boxes)."""
    return {"prompt": scene.prompt, "colour": scene.colour, "shape": scene.shape,
            "count": scene.count, "background": scene.background, "boxes": boxes,
            **({"size": scene.size} if scene.size else {})}


def drawn_size(index: int, seed: int, small: float) -> str:
    """The size sample `index` is drawn at when `small` of the images are small (its own
    generator, so the drawing's is untouched)."""
    return SIZES[0 if np.random.default_rng([seed, index, 8]).random() < small else 1]


def sample(index: int, seed: int, size: int, scenes: list[Scene], layout: str = "random",
           small: float | None = None):
    """(image, ground-truth record) of sample `index` (scene_at); each sample draws from its own
    generator, so sample i is the same whatever the count. `small`: an unsized scene is drawn
    small with this probability, large otherwise, its caption still without the size word (the
    record says which was drawn)."""
    scene = scene_at(index, seed, scenes)
    drawn = scene
    if small is not None and scene.size is None:
        drawn = scene.sized(drawn_size(index, seed, small))
    image, boxes = draw_scene(drawn, size, np.random.default_rng([seed, index]), layout=layout)
    return image, {**record_of(drawn, boxes), "prompt": scene.prompt}


DIRECTIONS = ((0, 1), (0, -1), (1, 0), (-1, 0))  # (dy, dx) per frame: right, left, down, up


def drifting_clip(image, frames: int, direction: tuple[int, int]) -> np.ndarray:
    """(frames, H, W, 3) uint8: `image` shifted by t * direction pixels in frame t, wrapped."""
    pixels = np.asarray(image)
    dy, dx = direction
    return np.stack([np.roll(pixels, (t * dy, t * dx), axis=(0, 1)) for t in range(frames)])


def build_shapes_dataset(directory: str, count: int = 16, size: int = 32, seed: int = 0,
                         split: str = "train", frames: int = 0, layout: str = "random",
                         small: float | None = None) -> str:
    """Write `count` samples of the split's scenes into `directory` (created; must not hold
    samples already), all-or-nothing through a temporary sibling directory. frames > 0: mp4
    clips of that many frames instead of PNG images. `layout` and `small`: see sample()."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {sorted(SPLITS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {list(LAYOUTS)}")
    if small is not None and not 0.0 <= small <= 1.0:
        raise ValueError(f"small must be a probability in [0, 1], got {small}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if frames < 0:
        raise ValueError(f"frames must be >= 0 (0: images), got {frames}")
    scenes = SPLITS[split]()
    directory = os.path.abspath(directory)
    if os.path.isdir(directory) and os.listdir(directory):
        raise FileExistsError(f"{directory} exists and is not empty")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        for i in range(count):
            image, record = sample(i, seed, size, scenes, layout, small)
            stem = os.path.join(tmp, f"{i:04d}")
            if frames:
                from wfm_jax.io.media import write_mp4
                direction = DIRECTIONS[i % len(DIRECTIONS)]
                write_mp4(stem + ".mp4", drifting_clip(image, frames, direction))
                record = {**record, "frames": frames, "direction": list(direction)}
            else:
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


def item_count(directory: str) -> int:
    """Items of a dataset build_shapes_dataset wrote (its NNNN.json records)."""
    return sum(1 for name in os.listdir(directory)
               if name.endswith(".json") and name[:-len(".json")].isdigit())


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
    p.add_argument("--frames", type=int, default=0, help="> 0: mp4 clips of this many frames")
    p.add_argument("--layout", default="random", choices=LAYOUTS,
                   help="fixed: one layout per count (the pretrained base's world)")
    p.add_argument("--small", type=float, default=None,
                   help="draw unsized scenes small with this probability (captions unchanged)")
    args = p.parse_args(argv)
    try:
        print(build_shapes_dataset(args.directory, args.count, args.size, args.seed, args.split,
                                   args.frames, args.layout, args.small))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
