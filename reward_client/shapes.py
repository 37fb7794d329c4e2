"""`shapes_alignment`: does an image show what a shapes-world prompt asks for?

The prompt is parsed with the shapes grammar (wfm_jax.worlds.shapes.grammar); the image is read with plain
image analysis: every pixel goes to its nearest palette colour (the four shape colours and the
two backgrounds), the border's majority is the background, the non-background pixels split into
8-connected components (specks dropped: under a size floor, or under a quarter of the largest
component, so that a blob with a stray fleck is one shape, not two), and each component's shape is read
from its width profiles (`shape_of`): the widths of its rows and the heights of its columns, each
over its largest, against those of a filled square (flat), circle (a half-ellipse) and upward triangle
(rows growing linearly, columns a tent), in squared error weighted by each row's or column's pixels.

Scores in [0, 1], one per attribute, returned as extra keys like GenEval's:
  background  1 if the border's colour is the asked background
  colour      fraction of the foreground pixels in the asked colour (0 without a foreground)
  count       max(0, 1 - |n - N| / N) over the n components (GenEval's partial credit)
  shape       fraction of the components whose width profiles read as the asked shape
  size        only when the prompt asks one ("a small red circle ..."): the fraction of the
              components whose bounding box's longer side is on the asked side of the world's
              small / large boundary for that count (grammar.size_threshold); NaN otherwise
and `shapes_alignment`, the mean of the attributes the prompt asks for.

A prompt outside the grammar is an error naming the sample (`shapes_alignment`); the
`shapes_alignment_lenient` variant scores it 0 on every key and warns once per batch.
"""
from __future__ import annotations

import warnings

import numpy as np

from reward_client.errors import RewardValueError
from reward_client.registry import register_reward
from wfm_jax.worlds.shapes.grammar import (
    BACKGROUNDS,
    COLOURS,
    PromptGrammarError,
    parse_prompt,
    size_threshold,
)

PALETTE_NAMES = list(COLOURS) + list(BACKGROUNDS)
PALETTE = np.asarray([*COLOURS.values(), *BACKGROUNDS.values()], np.float32)
N_COLOURS = len(COLOURS)
KEYS = ("background", "colour", "count", "shape")
MIN_AREA_AT_32 = 4  # pixels of a 32x32 image below which a component is a speck
# ... and below this fraction of the largest component: the world draws a scene's shapes at most
# (0.13 / 0.19)^2 = 0.47 apart in area, while RL was seen to score "two circles" with one
# 356-px blob and a 4-px fleck (DiffusionNFT on the tiny model, 2026-11-27)
MIN_FRACTION_OF_LARGEST = 0.25


def classify_pixels(image: np.ndarray) -> np.ndarray:
    """[H, W] index into PALETTE_NAMES of each pixel's nearest palette colour."""
    d = ((image[..., None, :].astype(np.float32) - PALETTE) ** 2).sum(-1)
    return d.argmin(-1)


def _profiles(n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(row widths, column heights) of each shape filling an n x n box, at the n centres, over
    their largest."""
    t = (np.arange(n) + 0.5) / n
    round_ = np.sqrt(np.clip(1.0 - (2.0 * t - 1.0) ** 2, 0.0, 1.0))
    return {"square": (np.ones(n), np.ones(n)), "circle": (round_, round_),
            "triangle": (t, 1.0 - np.abs(2.0 * t - 1.0))}


def shape_of(mask: np.ndarray) -> str:
    """The shape whose width profiles are nearest the component's ([h, w] bool, its bounding
    box). Each row's (column's) error is weighted by its pixels, so that a thin tip or whisker,
    which stretches the box by a few rows of one or two pixels, barely moves the reading: with
    the box's fill ratio alone (the reading until 2026-12-04) a 3 px tip on a 10-14 px circle made
    it a triangle, and RL learnt to draw such tips (docs/shapes_world.md, session 43)."""
    rows, cols = mask.sum(1).astype(np.float64), mask.sum(0).astype(np.float64)
    rows_t, cols_t = _profiles(len(rows)), _profiles(len(cols))

    def error(counts, template):
        return float(np.sum(counts * (counts / counts.max() - template) ** 2) / counts.sum())

    errors = {shape: error(rows, rows_t[shape][0]) + error(cols, cols_t[shape][1]) for shape in rows_t}
    return min(errors, key=errors.__getitem__)


def analyse(image: np.ndarray) -> dict:
    """What the image shows: background, foreground colour fractions, components' shapes."""
    import cv2

    labels = classify_pixels(image)
    border = np.concatenate([labels[0], labels[-1], labels[1:-1, 0], labels[1:-1, -1]])
    background = PALETTE_NAMES[int(np.bincount(border, minlength=len(PALETTE)).argmax())]
    foreground = labels < N_COLOURS
    fractions = np.bincount(labels[foreground], minlength=N_COLOURS)[:N_COLOURS]
    fractions = fractions / max(int(foreground.sum()), 1)
    n, comp, stats, _ = cv2.connectedComponentsWithStats(foreground.astype(np.uint8), connectivity=8)
    floor = max(2, MIN_AREA_AT_32 * image.shape[0] * image.shape[1] // 1024)
    min_area = max(floor, MIN_FRACTION_OF_LARGEST * int(stats[1:, cv2.CC_STAT_AREA].max(initial=0)))
    shapes, sides = [], []
    for i in range(1, n):
        x, y, w, h, area = (int(stats[i, k]) for k in (cv2.CC_STAT_LEFT, cv2.CC_STAT_TOP, cv2.CC_STAT_WIDTH,
                                                        cv2.CC_STAT_HEIGHT, cv2.CC_STAT_AREA))
        if area >= min_area:
            shapes.append(shape_of(comp[y:y + h, x:x + w] == i))
            sides.append(max(w, h))
    return {"background": background, "colour_fractions": dict(zip(COLOURS, fractions.tolist())),
            "foreground": int(foreground.sum()), "shapes": shapes, "sides": sides}


def score_image(image: np.ndarray, prompt: str) -> dict[str, float]:
    """Per-attribute scores and their mean for one uint8 [H, W, 3] image (PromptGrammarError
    for a prompt outside the grammar)."""
    scene = parse_prompt(prompt)
    seen = analyse(image)
    n = len(seen["shapes"])
    scores = {
        "background": float(seen["background"] == scene.background),
        "colour": float(seen["colour_fractions"][scene.colour]) if seen["foreground"] else 0.0,
        "count": max(0.0, 1.0 - abs(n - scene.count) / scene.count),
        "shape": sum(s == scene.shape for s in seen["shapes"]) / n if n else 0.0,
    }
    if scene.size is not None:
        threshold = size_threshold(scene.count, image.shape[0])
        large = [side > threshold for side in seen["sides"]]
        scores["size"] = (sum(is_large == (scene.size == "large") for is_large in large) / n
                          if n else 0.0)
    scores["shapes_alignment"] = float(np.mean(list(scores.values())))
    return scores


def _score_batch(images, prompts, *, lenient: bool) -> dict[str, np.ndarray]:
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise RewardValueError(f"shapes_alignment: images of shape {images.shape}, expected [N, H, W, 3]")
    out = {k: np.zeros(len(prompts)) for k in (*KEYS, "shapes_alignment")}
    sized = np.full(len(prompts), np.nan)  # a prompt without a size word has no size score
    unparsed = []
    for i, (image, prompt) in enumerate(zip(images, prompts)):
        try:
            scores = score_image(image, prompt)
        except PromptGrammarError as e:
            if not lenient:
                raise RewardValueError(f"shapes_alignment: sample {i}: {e} (use "
                                       "shapes_alignment_lenient to score such prompts 0)") from None
            unparsed.append(i)
            continue
        sized[i] = scores.pop("size", np.nan)
        for k, v in scores.items():
            out[k][i] = v
    if not np.isnan(sized).all():
        out["size"] = sized
    if unparsed:
        warnings.warn(f"shapes_alignment_lenient: {len(unparsed)} prompt(s) outside the shapes "
                      f"grammar scored 0 (samples {unparsed[:8]})", stacklevel=2)
    return out


@register_reward("shapes_alignment")
def shapes_alignment(images, prompts, extras):
    return _score_batch(images, prompts, lenient=False)


@register_reward("shapes_alignment_lenient")
def shapes_alignment_lenient(images, prompts, extras):
    out = _score_batch(images, prompts, lenient=True)
    out["shapes_alignment_lenient"] = out.pop("shapes_alignment")
    return out
