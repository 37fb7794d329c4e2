"""An independent reading of a shapes-world image, for measuring a model rather than training it.

`shapes_alignment` (reward_client/shapes.py) is the reward RL optimises; a model can learn to
please its particular reading. This detector reads the same images another way, and gives a
yes/no answer per attribute, so accuracy against chance is a measure RL does not optimise:

  foreground  pixels with chroma (max - min of R, G, B) at least 70 and at least half the image's
              own strongest (99th percentile): the four shape colours have chroma 140-195, the
              two backgrounds 0, a soft edge between two shapes about half (the reward instead
              snaps each pixel to the nearest palette entry)
  background  "white" if the border's median luminance is above mid-grey, else "black"
  colour      the hue (HSV, degrees) of each foreground pixel, snapped to the nearest of the
              palette's four hues; the image's colour is the majority
  count       4-connected components of the foreground, ignoring specks (under 4 px at 32x32,
              scaled with the area, or under 15% of the largest component)
  shape       each component against three templates drawn in its bounding box (a filled
              ellipse, rectangle and upward triangle, as the dataset draws them); the best
              intersection-over-union names it; the image's shape is the majority (ties: none)
  size        (prompts with a size word only) each component's area against the area the asked
              shape would have in a box of the world's small / large boundary side for the
              asked count (grammar.size_threshold); the image's size is the majority (ties: none).
              The reward reads the box's longer side instead

A prompt's attribute is detected correctly when the image's reading equals it; `all` needs
colour, shape and count together.
"""
from __future__ import annotations

import colorsys
from collections import Counter

import numpy as np
from PIL import Image, ImageDraw

from wfm_jax.worlds.shapes.grammar import COLOURS, SHAPES, parse_prompt, size_threshold

CHROMA_MIN = 70
MIN_AREA_AT_32 = 4
MIN_FRACTION_OF_LARGEST = 0.15
ATTRIBUTES = ("background", "colour", "shape", "count")
HUES = {name: 360.0 * colorsys.rgb_to_hsv(*(c / 255 for c in rgb))[0] for name, rgb in COLOURS.items()}


def _hue_degrees(pixels: np.ndarray) -> np.ndarray:
    """Hue in [0, 360) of float RGB pixels [N, 3] in [0, 1] (HSV's hexagonal hue)."""
    r, g, b = pixels[:, 0], pixels[:, 1], pixels[:, 2]
    high, low = pixels.max(1), pixels.min(1)
    span = np.maximum(high - low, 1e-6)
    hue = np.where(high == r, ((g - b) / span) % 6,
                   np.where(high == g, (b - r) / span + 2, (r - g) / span + 4))
    return 60.0 * hue


def _colour_of(pixels: np.ndarray) -> str | None:
    if not len(pixels):
        return None
    hue = _hue_degrees(pixels.astype(np.float32) / 255.0)
    names = list(HUES)
    centres = np.asarray([HUES[n] for n in names])
    gap = np.abs(hue[:, None] - centres[None, :])
    nearest = np.minimum(gap, 360.0 - gap).argmin(1)
    return names[int(np.bincount(nearest, minlength=len(names)).argmax())]


def _template(shape: str, w: int, h: int) -> np.ndarray:
    """The [h, w] boolean mask of `shape` filling a w x h box, drawn as the dataset draws it."""
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    if shape == "circle":
        draw.ellipse((0, 0, w - 1, h - 1), fill=1)
    elif shape == "square":
        draw.rectangle((0, 0, w - 1, h - 1), fill=1)
    else:
        draw.polygon([((w - 1) / 2, 0), (0, h - 1), (w - 1, h - 1)], fill=1)
    return np.asarray(canvas, bool)


def _shape_of(mask: np.ndarray) -> str:
    h, w = mask.shape
    ious = []
    for shape in SHAPES:
        t = _template(shape, w, h)
        ious.append((mask & t).sum() / max(int((mask | t).sum()), 1))
    return SHAPES[int(np.argmax(ious))]


def read_image(image: np.ndarray) -> dict:
    """{"background", "colour", "count", "shape", "shapes"} of one uint8 [H, W, 3] image;
    colour / shape None when there is no foreground (or the shapes tie)."""
    import cv2

    pixels = np.asarray(image)
    rgb = pixels.astype(np.int16)
    border = np.concatenate([rgb[0], rgb[-1], rgb[1:-1, 0], rgb[1:-1, -1]])
    luminance = np.median(border @ np.asarray([0.299, 0.587, 0.114]))
    background = "white" if luminance > 127.5 else "black"
    chroma = rgb.max(-1) - rgb.min(-1)
    # half the image's own strongest chroma: a soft edge between two shapes stays background
    foreground = chroma >= max(CHROMA_MIN, 0.5 * float(np.percentile(chroma, 99)))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(foreground.astype(np.uint8), connectivity=4)
    areas = stats[1:, cv2.CC_STAT_AREA]
    floor = max(2, MIN_AREA_AT_32 * pixels.shape[0] * pixels.shape[1] // 1024)
    if len(areas):
        floor = max(floor, MIN_FRACTION_OF_LARGEST * areas.max())
    shapes, areas_kept = [], []
    for i in range(1, n):
        if stats[i, cv2.CC_STAT_AREA] < floor:
            continue
        areas_kept.append(int(stats[i, cv2.CC_STAT_AREA]))
        x, y, w, h = (int(stats[i, k]) for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP,
                                                  cv2.CC_STAT_WIDTH, cv2.CC_STAT_HEIGHT))
        shapes.append(_shape_of(labels[y:y + h, x:x + w] == i))
    votes = Counter(shapes).most_common()
    shape = votes[0][0] if votes and (len(votes) == 1 or votes[0][1] > votes[1][1]) else None
    return {"background": background, "colour": _colour_of(pixels[foreground]),
            "count": len(shapes), "shape": shape, "shapes": shapes, "areas": areas_kept,
            "image_side": pixels.shape[0]}


def _size_of(reading: dict, shape: str, count: int) -> str | None:
    """"small" or "large" by the majority of the components' areas against the asked shape's
    area at the boundary side; None without components or on a tie."""
    side = size_threshold(count, reading["image_side"])
    boundary = float(_template(shape, round(side), round(side)).sum())
    votes = Counter("large" if a > boundary else "small" for a in reading["areas"]).most_common()
    if not votes or (len(votes) > 1 and votes[0][1] == votes[1][1]):
        return None
    return votes[0][0]


def correct(reading: dict, prompt: str) -> dict[str, bool]:
    """Per attribute (and `all`: colour, shape and count), whether `reading` matches `prompt`."""
    scene = parse_prompt(prompt)
    hits = {"background": reading["background"] == scene.background,
            "colour": reading["colour"] == scene.colour,
            "shape": reading["shape"] == scene.shape,
            "count": reading["count"] == scene.count}
    hits["all"] = hits["colour"] and hits["shape"] and hits["count"]
    if scene.size is not None:
        hits["size"] = _size_of(reading, scene.shape, scene.count) == scene.size
    return hits


def accuracy(images, prompts: list[str], *, chance_prompts: list[str] | None = None) -> dict:
    """Per-attribute accuracy of uint8 images [N, H, W, 3] against their prompts, and
    `chance_<attribute>`: the same readings scored against every prompt of `chance_prompts`
    (default: the distinct `prompts`), averaged, i.e. what a model ignoring its prompt scores."""
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images for {len(prompts)} prompts")
    readings = [read_image(im) for im in images]
    hits = [correct(r, p) for r, p in zip(readings, prompts)]
    # size: over the prompts that ask one
    keys = (*ATTRIBUTES, "all", *(("size",) if any("size" in h for h in hits) else ()))

    def mean(rows, k):
        return float(np.mean([h[k] for h in rows if k in h]))

    out = {k: mean(hits, k) for k in keys}
    others = chance_prompts or sorted(set(prompts))
    against = [correct(r, q) for r in readings for q in others]
    out.update({f"chance_{k}": mean(against, k) for k in keys})
    out["n"] = len(readings)
    return out
