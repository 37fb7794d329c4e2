"""The tiny VQA world's scenes and questions (specs/reason2.md §7), deterministic in a seed.

A scene is a 3x3 grid of 32 px cells on a white or black background; each cell is empty or holds
one shape (circle / square / triangle) in one colour (red / green / blue / yellow), with at most
three shapes of any colour so counting answers stay within 0-3. At 96x96 px the Qwen3-VL
processor keeps the image as is (grid 1x6x6) and its 2x2 merge gives one visual token per cell.

Questions are multiple choice with four lettered options (shuffled, or in a fixed order): the colour or the shape in a
named cell, the background, how many shapes of a colour there are, and which colour is most
frequent. The target is cosmos-rl's format, `<think>...</think>\\n\\n<answer>B</answer>`, so its
`format` and `single_choice` rewards apply unchanged.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS, SHAPES

GRID, CELL = 3, 32
SIZE = GRID * CELL
# A cell's name is one word, a compass point (north at the top), so the tiny tokenizer keeps it one
# token: the think step "northwest red" then reads the cell in one attention hop (the name's own
# embedding is the query), where "top left" needs two tokens combined first, which the tiny model
# never learned (docs/reason2_post_training.md).
CELL_NAMES = ("northwest", "north", "northeast", "west", "centre", "east", "southwest", "south", "southeast")
LETTERS = "ABCD"
EMPTY = "nothing"
MAX_PER_COLOUR = 3
# Two distractors never drawn: the background question still has four options.
BACKGROUND_OPTIONS = (*BACKGROUNDS, "grey", "pink")
QUESTION_TYPES = ("colour", "shape", "background", "count", "most_frequent")
THINK = "I look at the image."  # fixed reasoning text of SFT targets (spec §7)
# SFT target styles: "fixed" thinks THINK; "answer" thinks "the answer is <text>", then names its
# letter (a tiny model learns the lookup and the letter binding as two easier steps); "look" thinks
# "<subject> <text>" (e.g. "north red", "background black"): the token just before the answer word
# names what to look at, so each step is one attention hop
TARGET_STYLES = ("fixed", "answer", "look")
# option orders: "shuffled" per question, or "fixed" (each type's options always in one order, so
# an answer word always has the same letter: the letter is a lookup, not a copy from the prompt)
OPTION_ORDERS = ("shuffled", "fixed")
INSTRUCTION = "Answer with the letter of the correct option."
# The pre-training task of the world's base model (families.qwen3_vl.tiny, worlds.vqa.model):
# every cell named, then its content, in reading order, then the background (describe()).
DESCRIBE_PROMPT = "What is in the picture?"
HELDOUT_BUCKETS = 5  # one scene in five (by content hash) belongs to the held-out split


@dataclass(frozen=True)
class Scene:
    """cells: nine entries in row-major order, each None or (colour, shape)."""
    background: str
    cells: tuple[tuple[str, str] | None, ...]

    def __post_init__(self):
        if len(self.cells) != GRID * GRID:
            raise ValueError(f"a scene has {GRID * GRID} cells, got {len(self.cells)}")
        if self.background not in BACKGROUNDS:
            raise ValueError(f"unknown background {self.background!r} (known: {', '.join(BACKGROUNDS)})")
        for cell in self.cells:
            if cell is not None and (cell[0] not in COLOURS or cell[1] not in SHAPES):
                raise ValueError(f"unknown cell content {cell!r}")

    @property
    def key(self) -> str:
        """A canonical string of the content: equal scenes (as pictures) have equal keys."""
        return self.background + "|" + ",".join("-" if c is None else f"{c[0]}:{c[1]}" for c in self.cells)

    def count(self, colour: str) -> int:
        return sum(1 for c in self.cells if c is not None and c[0] == colour)

    def to_json(self) -> dict:
        return {"background": self.background, "cells": [None if c is None else list(c) for c in self.cells]}

    @classmethod
    def from_json(cls, d: dict) -> Scene:
        return cls(d["background"], tuple(None if c is None else (c[0], c[1]) for c in d["cells"]))


def split_of(scene: Scene) -> str:
    """'heldout' or 'train', from a hash of the content, so no picture is ever in both splits."""
    digest = hashlib.sha256(scene.key.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "little") % HELDOUT_BUCKETS == 0 else "train"


def random_scene(rng: np.random.Generator) -> Scene:
    """Two to six shapes in distinct cells, no colour more than three times."""
    colours, backgrounds = list(COLOURS), list(BACKGROUNDS)
    while True:
        n = int(rng.integers(2, 7))
        where = set(rng.choice(GRID * GRID, size=n, replace=False).tolist())
        cells = tuple((colours[int(rng.integers(len(colours)))], SHAPES[int(rng.integers(len(SHAPES)))])
                      if i in where else None for i in range(GRID * GRID))
        scene = Scene(backgrounds[int(rng.integers(len(backgrounds)))], cells)
        if all(scene.count(c) <= MAX_PER_COLOUR for c in colours):
            return scene


def draw(scene: Scene, rng: np.random.Generator | None = None) -> Image.Image:
    """The 96x96 RGB picture. Each shape covers its cell's centre (the tests read it back there);
    `rng` jitters sizes and offsets a little."""
    image = Image.new("RGB", (SIZE, SIZE), BACKGROUNDS[scene.background])
    pen = ImageDraw.Draw(image)
    for i, cell in enumerate(scene.cells):
        if cell is None:
            continue
        colour, shape = cell
        half = CELL * (0.34 if rng is None else rng.uniform(0.28, 0.4))
        dx, dy = (0.0, 0.0) if rng is None else rng.uniform(-2, 2, size=2)
        cx, cy = (i % GRID + 0.5) * CELL + dx, (i // GRID + 0.5) * CELL + dy
        box = (cx - half, cy - half, cx + half, cy + half)
        fill = COLOURS[colour]
        if shape == "circle":
            pen.ellipse(box, fill=fill)
        elif shape == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(cx, box[1]), (box[0], box[3]), (box[2], box[3])], fill=fill)
    return image


@dataclass(frozen=True)
class Question:
    kind: str
    text: str  # the question sentence alone
    options: tuple[str, ...]  # four, in the order the letters give them
    answer: str  # the correct option's text
    subject: str  # one word naming what the question looks at: a cell, "background", a colour, "most"

    @property
    def letter(self) -> str:
        return LETTERS[self.options.index(self.answer)]

    @property
    def prompt(self) -> str:
        lines = [self.text, *(f"{LETTERS[i]}. {o}" for i, o in enumerate(self.options)), INSTRUCTION]
        return "\n".join(lines)

    @property
    def target(self) -> str:
        return self.target_in("fixed")

    def target_in(self, style: str) -> str:
        """The SFT answer in cosmos-rl's format, its think text by `style` (TARGET_STYLES)."""
        if style not in TARGET_STYLES:
            raise ValueError(f"target style {style!r}: expected one of {', '.join(TARGET_STYLES)}")
        # "the answer is red": the answer word comes with a leading space, the same token as in
        # the option line "B. red", which the letter is then copied from
        think = {"fixed": THINK, "answer": f"the answer is {self.answer}",
                 "look": f"{self.subject} {self.answer}"}[style]
        return f"<think>\n{think}\n</think>\n\n<answer>{self.letter}</answer>"


def _ordered(options, rng: np.random.Generator, shuffle: bool) -> tuple[str, ...]:
    """The options shuffled, or in their canonical order; the permutation is drawn either way so
    the rest of the sample (the image's jitter) is the same in both styles."""
    order = rng.permutation(len(options))
    return tuple(options[int(i)] for i in order) if shuffle else tuple(options)


def most_frequent(scene: Scene) -> str | None:
    """The colour drawn most often, None on a tie."""
    counts = {c: scene.count(c) for c in COLOURS}
    best = max(counts.values())
    winners = [c for c, n in counts.items() if n == best]
    return winners[0] if len(winners) == 1 else None


def ask(scene: Scene, kind: str, rng: np.random.Generator, shuffle: bool = True) -> Question:
    """A question of `kind` about `scene`; most_frequent on a tie falls back to a count question.
    shuffle=False keeps each type's options in one canonical order (OPTION_ORDERS)."""
    if kind not in QUESTION_TYPES:
        raise ValueError(f"unknown question type {kind!r} (known: {', '.join(QUESTION_TYPES)})")
    if kind == "colour":
        occupied = [i for i, c in enumerate(scene.cells) if c is not None]
        i = occupied[int(rng.integers(len(occupied)))]
        return Question(kind, f"What colour is the shape in the {CELL_NAMES[i]} cell?",
                        _ordered(list(COLOURS), rng, shuffle), scene.cells[i][0], CELL_NAMES[i])
    if kind == "shape":
        i = int(rng.integers(GRID * GRID))
        answer = EMPTY if scene.cells[i] is None else scene.cells[i][1]
        options = _ordered([*SHAPES, EMPTY], rng, shuffle)
        return Question(kind, f"What is in the {CELL_NAMES[i]} cell?", options, answer, CELL_NAMES[i])
    if kind == "background":
        return Question(kind, "What colour is the background?", _ordered(list(BACKGROUND_OPTIONS), rng, shuffle),
                        scene.background, "background")
    if kind == "most_frequent":
        winner = most_frequent(scene)
        if winner is not None:
            return Question(kind, "Which colour do most shapes have?", _ordered(list(COLOURS), rng, shuffle),
                            winner, "most")
        kind = "count"
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    options = [str(n) for n in range(MAX_PER_COLOUR + 1)]
    return Question("count", f"How many {colour} shapes are there?", _ordered(options, rng, shuffle),
                    str(scene.count(colour)), colour)


def describe(scene: Scene) -> str:
    """The description target: "northwest red circle\nnorth nothing\n...\nbackground white"."""
    lines = [f"{name} {EMPTY}" if cell is None else f"{name} {cell[0]} {cell[1]}"
             for name, cell in zip(CELL_NAMES, scene.cells)]
    return "\n".join([*lines, f"background {scene.background}"])


def vocabulary() -> list[str]:
    """Every word the world's prompts and targets use (the tiny tokenizer keeps them whole)."""
    words = set(THINK.replace(".", " ").split()) | set(INSTRUCTION.replace(".", " ").split())
    words |= set(DESCRIBE_PROMPT.rstrip("?").split())
    for text in ("What colour is the shape in the cell", "What is in the", "What colour is the background",
                 "How many shapes are there", "Which colour do most shapes have"):
        words |= set(text.split())
    words |= set(CELL_NAMES) | set(COLOURS) | set(SHAPES) | set(BACKGROUND_OPTIONS) | {EMPTY}
    words |= {"think", "answer"}
    return sorted(words)
