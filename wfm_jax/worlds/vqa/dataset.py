"""The VQA world as an SFT data set in LLaVA's layout (specs/reason2.md §4.1), deterministic in the seed:

    DIR/annotations.json   a list of records, one per question
    DIR/images/000000.png  one 96x96 picture per record

Each record: {"id", "image" (relative to DIR), "conversations": [{"from": "human", "value":
"<image>\\n<question, options A-D, instruction>"}, {"from": "gpt", "value": "<think>\\n...\\n</think>\\n\\n
<answer>B</answer>"}]}, plus the ground truth for scoring: "answer" (the letter), "answer_text",
"question_type", "options" and "scene" (background and the nine cells).

Splits: `train` and `heldout` draw from disjoint sets of scenes (a content hash puts one scene in
five into `heldout`), so no held-out picture, nor any of its questions, is ever seen in training.

    python -m wfm_jax.worlds.vqa DIR [--count 256] [--split train|heldout] [--seed 0]
                                     [--types colour,shape,background,count,most_frequent]
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from wfm_jax.io.atomic import atomic_directory
from wfm_jax.worlds.vqa.scenes import (
    DESCRIBE_PROMPT,
    OPTION_ORDERS,
    QUESTION_TYPES,
    TARGET_STYLES,
    Question,
    Scene,
    ask,
    describe,
    draw,
    random_scene,
    split_of,
)

SPLITS = ("train", "heldout")
ANNOTATIONS = "annotations.json"
_SPLIT_STREAM = {"train": 1, "heldout": 2}  # separate random streams per split


def sample(index: int, seed: int, split: str, types: Sequence[str] = QUESTION_TYPES, options: str = "shuffled"):
    """(scene, question, image) of sample `index`: its own generator, so sample i is the same
    whatever the count; question types cycle through `types` so any count covers them evenly.
    options: "shuffled" or "fixed" (scenes.OPTION_ORDERS); the scene and image do not depend on it."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    if not types:
        raise ValueError("at least one question type is needed")
    rng = np.random.default_rng([seed, _SPLIT_STREAM[split], index])
    scene = random_scene(rng)
    while split_of(scene) != split:
        scene = random_scene(rng)
    if options not in OPTION_ORDERS:
        raise ValueError(f"option order {options!r}: expected one of {', '.join(OPTION_ORDERS)}")
    question = ask(scene, types[index % len(types)], rng, shuffle=options == "shuffled")
    return scene, question, draw(scene, rng)


def record(sample_id: str, image: str, scene: Scene, question: Question, target: str = "fixed") -> dict:
    return {"id": sample_id, "image": image,
            "conversations": [{"from": "human", "value": "<image>\n" + question.prompt},
                              {"from": "gpt", "value": question.target_in(target)}],
            "answer": question.letter, "answer_text": question.answer, "question_type": question.kind,
            "options": list(question.options), "scene": scene.to_json()}


def build_vqa_dataset(directory: str, count: int = 256, split: str = "train", seed: int = 0,
                      types: Sequence[str] = QUESTION_TYPES, overwrite: bool = False,
                      target: str = "fixed", options: str = "shuffled") -> str:
    """Write `count` records of `split` into `directory`, all or nothing (a temporary sibling
    renamed into place). An existing non-empty directory is an error unless `overwrite`.
    target: the SFT answers' think style (scenes.TARGET_STYLES); options: the option order
    (scenes.OPTION_ORDERS)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if target not in TARGET_STYLES:
        raise ValueError(f"target style {target!r}: expected one of {', '.join(TARGET_STYLES)}")
    if options not in OPTION_ORDERS:
        raise ValueError(f"option order {options!r}: expected one of {', '.join(OPTION_ORDERS)}")
    unknown = [t for t in types if t not in QUESTION_TYPES]
    if unknown:
        raise ValueError(f"unknown question types {unknown} (known: {', '.join(QUESTION_TYPES)})")

    def one(i: int, image_name: str):
        scene, question, image = sample(i, seed, split, tuple(types), options)
        return record(f"{split}-{seed}-{i:06d}", image_name, scene, question, target), image

    return _write_records(directory, count, overwrite, one)


def build_description_dataset(directory: str, count: int = 1024, seed: int = 0, overwrite: bool = False) -> str:
    """The base model's pre-training set: `count` training-split pictures (the VQA set's scenes
    for the same seed and index), each with DESCRIBE_PROMPT and its description (scenes.describe)
    as the answer; no held-out picture is ever described."""

    def one(i: int, image_name: str):
        scene, _, image = sample(i, seed, "train")
        return {"id": f"describe-{seed}-{i:06d}", "image": image_name, "scene": scene.to_json(),
                "conversations": [{"from": "human", "value": "<image>\n" + DESCRIBE_PROMPT},
                                  {"from": "gpt", "value": describe(scene)}]}, image

    return _write_records(directory, count, overwrite, one)


def _write_records(directory: str, count: int, overwrite: bool, one) -> str:
    """`count` records and their pictures into `directory`, all or nothing (a temporary sibling
    renamed into place); one(i, image_name) -> (record, PIL image). An existing non-empty
    directory is an error unless `overwrite`."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    directory = os.path.abspath(directory)
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise FileExistsError(f"{directory} exists and is not empty")
    with atomic_directory(directory) as tmp:
        os.makedirs(os.path.join(tmp, "images"))
        records = []
        for i in range(count):
            name = f"images/{i:06d}.png"
            rec, image = one(i, name)
            image.save(os.path.join(tmp, name))
            records.append(rec)
        with open(os.path.join(tmp, ANNOTATIONS), "w") as f:
            json.dump(records, f, indent=1)
    return directory


def ensure_vqa_dataset(directory: str, **kwargs) -> str:
    """Build the data set unless `directory` already holds one (safe if another process races)."""
    if os.path.isfile(os.path.join(directory, ANNOTATIONS)):
        return os.path.abspath(directory)
    try:
        return build_vqa_dataset(directory, **kwargs)
    except (FileExistsError, OSError):
        if os.path.isfile(os.path.join(directory, ANNOTATIONS)):
            return os.path.abspath(directory)
        raise


def load_records(directory: str) -> list[dict]:
    path = os.path.join(directory, ANNOTATIONS)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {ANNOTATIONS} (build it with python -m wfm_jax.worlds.vqa)")
    with open(path) as f:
        return json.load(f)
