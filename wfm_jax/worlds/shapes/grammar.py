"""The shapes world: its prompt grammar, the parse of a prompt back into attributes, and the
drawing of one scene. The dataset (tiny_dataset.py) and the `shapes_alignment` reward share it.

Grammar:  "a [size] {colour} {shape} on a {background} background"
          "{two|three} [size] {colour} {shape}s on a {background} background"

The size word (small, large) is optional and asks for a sized scene (SIZE_HALF). The pretrained
base's captions never carry it: its images are drawn small or large at random with captions
that do not say which, so following the word is left for RL to teach (docs/shapes_world.md,
"A size word only RL is asked for").

Two layouts: "random" places each box anywhere (the tiny SFT and video recipes' data); "fixed"
puts every scene of a count at the same places (FIXED_LAYOUTS), each box moved by up to 1 px,
so a model has one layout per count to learn (the pretrained base's world, session 42).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from wfm_jax.core.errors import UserError

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220),
           "yellow": (235, 210, 40)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15)}
SHAPES = ("circle", "square", "triangle")
COUNT_WORDS = {1: "a", 2: "two", 3: "three"}
SIZES = ("small", "large")
# half the side of a small and of a large shape's box, as fractions of the image side, by count:
# the sized scenes' drawings. The large ones are the sizes the one-layout-per-count world reads
# best at (docs/shapes_world.md, session 42); the small ones about 0.7x their side
SIZE_HALF = {1: (0.20, 0.28), 2: (0.135, 0.19), 3: (0.12, 0.17)}

_PATTERN = re.compile(
    r"^\s*(?P<count>a|an|one|two|three)\s+(?:(?P<size>small|large)\s+)?(?P<colour>\w+)\s+(?P<shape>\w+?)(?P<plural>s?)"
    r"\s+on\s+an?\s+(?P<background>\w+)\s+background\s*\.?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    count: int
    background: str
    size: str | None = None  # "small" or "large" when the prompt asks; None: either

    @property
    def prompt(self) -> str:
        noun = self.shape if self.count == 1 else self.shape + "s"
        size = f"{self.size} " if self.size else ""
        return f"{COUNT_WORDS[self.count]} {size}{self.colour} {noun} on a {self.background} background"

    def sized(self, size: str | None) -> Scene:
        return Scene(self.colour, self.shape, self.count, self.background, size)


class PromptGrammarError(UserError, ValueError):
    """A prompt the shapes grammar does not produce."""


def parse_prompt(prompt: str) -> Scene:
    """The scene a prompt asks for; PromptGrammarError (naming the part) if outside the grammar."""
    m = _PATTERN.match(prompt)
    if not m:
        raise PromptGrammarError(f"prompt {prompt!r} is not '<a|two|three> [small|large] <colour> <shape>[s] on a "
                                 "<background> background'")
    words = {k: m.group(k).lower() for k in ("count", "colour", "shape", "background")}
    count = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}[words["count"]]
    for key, allowed in (("colour", COLOURS), ("shape", SHAPES), ("background", BACKGROUNDS)):
        if words[key] not in allowed:
            raise PromptGrammarError(f"prompt {prompt!r}: unknown {key} {words[key]!r} "
                                     f"(known: {', '.join(allowed)})")
    if (count > 1) != bool(m.group("plural")):
        raise PromptGrammarError(f"prompt {prompt!r}: count and plural disagree")
    size = m.group("size").lower() if m.group("size") else None
    return Scene(words["colour"], words["shape"], count, words["background"], size)


def all_scenes() -> list[Scene]:
    """Every scene of the grammar (72), in a fixed order."""
    return [Scene(c, s, n, b) for n, c, s, b in
            itertools.product(COUNT_WORDS, COLOURS, SHAPES, BACKGROUNDS)]


def heldout_scenes() -> list[Scene]:
    """Scenes the pretraining never sees (12 of 72): each colour with one shape and background it
    is never drawn with alone or in groups, so following them needs composition, not recall."""
    held = []
    for i, colour in enumerate(COLOURS):
        shape = SHAPES[i % len(SHAPES)]
        background = list(BACKGROUNDS)[i % len(BACKGROUNDS)]
        held += [Scene(colour, shape, n, background) for n in COUNT_WORDS]
    return held


def train_scenes() -> list[Scene]:
    held = set(heldout_scenes())
    return [s for s in all_scenes() if s not in held]


# half the side of a shape's box, as a fraction of the image side, by count: one shape is large;
# two or three share the canvas
HALF_SIDE = {1: (0.22, 0.34), 2: (0.13, 0.19), 3: (0.11, 0.15)}


def _box(half: float, size: int, rng: np.random.Generator) -> tuple[float, ...]:
    """A square box of half-side `half` anywhere inside the image, 1 px from its edges."""
    cx, cy = rng.uniform(half + 1, size - half - 1, size=2)
    return (cx - half, cy - half, cx + half, cy + half)


def size_threshold(count: int, image_size: int) -> float:
    """The box side in px between a small and a large shape of a `count`-shape scene: the
    geometric mean of the two drawn sides."""
    small, large = SIZE_HALF[count]
    return 2.0 * image_size * float(np.sqrt(small * large))


def _layout(count: int, size: int, rng: np.random.Generator, max_tries: int,
            half: float | None = None):
    """Boxes (x0, y0, x1, y1) of `count` squares-around-shapes that neither overlap nor touch
    (a gap of 2 px keeps them separate components), inside the image; a layout that runs out of
    room starts again. `half`: every box's half-side as a fraction of the image side (a sized
    scene); None draws each from HALF_SIDE."""
    lo, hi = HALF_SIDE[count] if half is None else (half, half)
    for _ in range(max_tries):
        boxes = []
        for _ in range(50):
            box = _box(size * rng.uniform(lo, hi), size, rng)
            if not any(box[0] < b[2] + 2 and b[0] < box[2] + 2 and box[1] < b[3] + 2
                       and b[1] < box[3] + 2 for b in boxes):
                boxes.append(box)
                if len(boxes) == count:
                    return boxes
    raise RuntimeError(f"could not place {count} shapes on {size}x{size} px")


# the fixed layout's box centres (x, y) as fractions of the image side, by count: one shape
# centred, two side by side, three in a triangle; an unsized scene's boxes take the large size
FIXED_LAYOUTS = {1: ((0.5, 0.5),), 2: ((0.25, 0.5), (0.75, 0.5)),
                 3: ((0.27, 0.28), (0.73, 0.28), (0.5, 0.72))}
FIXED_JITTER = 1.0  # px each box centre may move, each axis
LAYOUTS = ("random", "fixed")


def _fixed_layout(count: int, size: int, rng: np.random.Generator, half: float | None = None,
                  jitter: float = FIXED_JITTER):
    """FIXED_LAYOUTS' boxes for `count` shapes of half-side `half` (default the large size),
    each centre moved by up to `jitter` px."""
    half = SIZE_HALF[count][1] if half is None else half
    boxes = []
    for cx, cy in FIXED_LAYOUTS[count]:
        dx, dy = rng.uniform(-jitter, jitter, size=2)
        x, y, h = cx * size + dx, cy * size + dy, half * size
        boxes.append((x - h, y - h, x + h, y + h))
    return boxes


def draw_scene(scene: Scene, size: int, rng: np.random.Generator, max_tries: int = 100,
               layout: str = "random"):
    """(PIL image, boxes [x0, y0, x1, y1] per shape); a sized scene's shapes at SIZE_HALF;
    `layout` one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
    image = Image.new("RGB", (size, size), BACKGROUNDS[scene.background])
    draw = ImageDraw.Draw(image)
    colour = COLOURS[scene.colour]
    half = None if scene.size is None else SIZE_HALF[scene.count][SIZES.index(scene.size)]
    boxes = (_fixed_layout(scene.count, size, rng, half) if layout == "fixed"
             else _layout(scene.count, size, rng, max_tries, half))
    for x0, y0, x1, y1 in boxes:
        if scene.shape == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif scene.shape == "square":
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=colour)
    return image, [[round(float(v), 2) for v in b] for b in boxes]


def sized(scenes: list[Scene]) -> list[Scene]:
    """Each scene asked small, then large."""
    return [s.sized(z) for s in scenes for z in SIZES]


# the *_sized splits: the same scenes with each size word (what RL on the size word uses)
SPLIT_SCENES = {"train": train_scenes, "heldout": heldout_scenes, "all": all_scenes,
                "train_sized": lambda: sized(train_scenes()),
                "heldout_sized": lambda: sized(heldout_scenes())}
