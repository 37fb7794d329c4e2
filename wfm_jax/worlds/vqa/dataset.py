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
                                     [--target look] [--fixed-think-fraction 0.5]

Mixed reasoning: with fixed_think_fraction f, a share f of the answers (drawn per record from its own
stream, so the scenes and questions do not change) think the fixed THINK sentence instead of the
target style's, and each record says which it got in "think_style". A model trained on such data
samples both; only one of them reads the picture first (docs/reason2_post_training.md).
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
_THINK_STREAM = 3  # the per-record think-style draw (think_style)


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
            "options": list(question.options), "scene": scene.to_json(), "think_style": target}


def think_style(index: int, seed: int, split: str, target: str, fixed_think_fraction: float) -> str:
    """Record `index`'s think style: "fixed" with probability fixed_think_fraction, else `target`;
    drawn from a stream of its own, so the sample (scene, question, picture) stays as it was."""
    if fixed_think_fraction <= 0:
        return target
    draw = np.random.default_rng([seed, _SPLIT_STREAM[split], index, _THINK_STREAM]).random()
    return "fixed" if draw < fixed_think_fraction else target


def build_vqa_dataset(directory: str, count: int = 256, split: str = "train", seed: int = 0,
                      types: Sequence[str] = QUESTION_TYPES, overwrite: bool = False,
                      target: str = "fixed", options: str = "shuffled", fixed_think_fraction: float = 0.0) -> str:
    """Write `count` records of `split` into `directory`, all or nothing (a temporary sibling
    renamed into place). An existing non-empty directory is an error unless `overwrite`.
    target: the SFT answers' think style (scenes.TARGET_STYLES); options: the option order
    (scenes.OPTION_ORDERS); fixed_think_fraction: the share of answers that think the fixed
    sentence instead (think_style)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not 0.0 <= fixed_think_fraction <= 1.0:
        raise ValueError(f"fixed_think_fraction must be within [0, 1], got {fixed_think_fraction}")
    if target not in TARGET_STYLES:
        raise ValueError(f"target style {target!r}: expected one of {', '.join(TARGET_STYLES)}")
    if options not in OPTION_ORDERS:
        raise ValueError(f"option order {options!r}: expected one of {', '.join(OPTION_ORDERS)}")
    unknown = [t for t in types if t not in QUESTION_TYPES]
    if unknown:
        raise ValueError(f"unknown question types {unknown} (known: {', '.join(QUESTION_TYPES)})")

    def one(i: int, image_name: str):
        scene, question, image = sample(i, seed, split, tuple(types), options)
        style = think_style(i, seed, split, target, fixed_think_fraction)
        return record(f"{split}-{seed}-{i:06d}", image_name, scene, question, style), image

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
    """Build the data set unless `directory` already holds one (safe if another process races);
    one it holds must have been built with these settings (check_vqa_dataset)."""
    if os.path.isfile(os.path.join(directory, ANNOTATIONS)):
        check_vqa_dataset(directory, **kwargs)
        return os.path.abspath(directory)
    try:
        return build_vqa_dataset(directory, **kwargs)
    except (FileExistsError, OSError):
        if os.path.isfile(os.path.join(directory, ANNOTATIONS)):
            check_vqa_dataset(directory, **kwargs)
            return os.path.abspath(directory)
        raise


def check_vqa_dataset(directory: str, count: int = 256, split: str = "train", seed: int = 0,
                      types: Sequence[str] = QUESTION_TYPES, target: str = "fixed",
                      fixed_think_fraction: float = 0.0, **_options) -> None:
    """ValueError (one line) unless the set in `directory` has the records these settings build:
    their ids (count, split, seed), question types and think styles. The pictures and the option
    order are not redrawn. A record from before think styles were recorded counts as `target`'s."""
    records = load_records(directory)
    want = [f"{split}-{seed}-{i:06d}" for i in range(count)]
    got = [r.get("id") for r in records]
    extra_types = sorted({str(r.get("question_type")) for r in records} - set(types))
    if got != want:
        differs = f"{len(got)} records from {got[0] if got else None!r}, not {count} from {want[0]!r}"
    elif extra_types:
        differs = f"question types {extra_types} not in {list(types)}"
    else:
        wrong = [i for i, r in enumerate(records)
                 if r.get("think_style", target) != think_style(i, seed, split, target, fixed_think_fraction)]
        differs = (f"{len(wrong)} answers think in another style than target={target!r}, fixed_think_fraction="
                   f"{fixed_think_fraction} give" if wrong else "")
    if differs:
        raise ValueError(f"{directory} holds a VQA set built with other settings ({differs}); "
                         f"delete it or point the recipe at another directory")


def load_records(directory: str) -> list[dict]:
    path = os.path.join(directory, ANNOTATIONS)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {ANNOTATIONS} (build it with python -m wfm_jax.worlds.vqa)")
    with open(path) as f:
        return json.load(f)
