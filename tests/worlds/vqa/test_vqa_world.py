"""The tiny VQA world: deterministic per seed, train and held-out scenes disjoint, every answer
recomputed from the scene's ground truth (and the picture's pixels) by code independent of
scenes.py, targets in cosmos-rl's think/answer format."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from PIL import Image

from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS
from wfm_jax.worlds.vqa.__main__ import main as cli
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset, load_records, sample
from wfm_jax.worlds.vqa.scenes import Scene, split_of
from wfm_jax.worlds.vqa.score import accuracy, extract_answer

# cosmos-rl's `format` reward pattern (specs/reason2.md §4.3)
FORMAT = re.compile(r"^<think>([^<]*(?:<(?!/?think>)[^<]*)*)<\/think>\n\n<answer>([\s\S]*?)<\/answer>$",
                    re.DOTALL)
# cells by compass point, north at the top, in reading order (written out here, not imported)
CELLS = ["northwest", "north", "northeast", "west", "centre", "east", "southwest", "south", "southeast"]


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory):
    return build_vqa_dataset(str(tmp_path_factory.mktemp("vqa") / "train"), count=150, split="train", seed=3)


@pytest.fixture(scope="module")
def heldout_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vqa") / "heldout"
    return build_vqa_dataset(str(directory), count=60, split="heldout", seed=3)


def _expected(rec: dict) -> str:
    """The answer text, from the question sentence and the scene record alone."""
    question = rec["conversations"][0]["value"].split("\n")[1]
    cells, background = rec["scene"]["cells"], rec["scene"]["background"]
    colours = [c[0] for c in cells if c is not None]
    if m := re.fullmatch(r"What colour is the shape in the (\w+) cell\?", question):
        return cells[CELLS.index(m[1])][0]
    if m := re.fullmatch(r"What is in the (\w+) cell\?", question):
        cell = cells[CELLS.index(m[1])]
        return "nothing" if cell is None else cell[1]
    if question == "What colour is the background?":
        return background
    if m := re.fullmatch(r"How many (\w+) shapes are there\?", question):
        return str(colours.count(m[1]))
    assert question == "Which colour do most shapes have?", question
    best = max(colours.count(c) for c in COLOURS)
    winners = [c for c in COLOURS if colours.count(c) == best]
    assert len(winners) == 1
    return winners[0]


def test_every_answer_follows_from_the_scene(train_dir, heldout_dir):
    kinds = set()
    for directory in (train_dir, heldout_dir):
        for rec in load_records(directory):
            prompt = rec["conversations"][0]["value"]
            assert prompt.startswith("<image>\n")
            lines = prompt.split("\n")
            options = [line[3:] for line in lines[2:6]]
            assert [line[:3] for line in lines[2:6]] == ["A. ", "B. ", "C. ", "D. "]
            assert options == rec["options"] and len(set(options)) == 4
            expected = _expected(rec)
            assert rec["answer_text"] == expected
            assert options["ABCD".index(rec["answer"])] == expected
            target = rec["conversations"][1]["value"]
            assert FORMAT.search(target) and extract_answer(target) == rec["answer"]
            kinds.add(rec["question_type"])
    assert kinds == {"colour", "shape", "background", "count", "most_frequent"}


def test_pictures_show_the_ground_truth(train_dir):
    """Each cell's centre pixel is its shape's colour, or the background where the cell is empty."""
    for rec in load_records(train_dir)[:40]:
        pixels = np.asarray(Image.open(os.path.join(train_dir, rec["image"])))
        assert pixels.shape == (96, 96, 3)
        for i, cell in enumerate(rec["scene"]["cells"]):
            centre = pixels[(i // 3) * 32 + 16, (i % 3) * 32 + 16]
            want = BACKGROUNDS[rec["scene"]["background"]] if cell is None else COLOURS[cell[0]]
            np.testing.assert_array_equal(centre, want, err_msg=f"{rec['id']} cell {i}")


def test_heldout_scenes_never_appear_in_train(train_dir, heldout_dir):
    def keys(directory):
        return {Scene.from_json(r["scene"]).key for r in load_records(directory)}
    train, held = keys(train_dir), keys(heldout_dir)
    assert train.isdisjoint(held)
    assert {split_of(Scene.from_json(r["scene"])) for r in load_records(train_dir)} == {"train"}
    assert {split_of(Scene.from_json(r["scene"])) for r in load_records(heldout_dir)} == {"heldout"}


def test_deterministic_in_the_seed(tmp_path, train_dir):
    again = build_vqa_dataset(str(tmp_path / "again"), count=20, split="train", seed=3)
    first = load_records(train_dir)[:20]
    assert load_records(again) == first
    for rec in first:
        with open(os.path.join(train_dir, rec["image"]), "rb") as a, \
                open(os.path.join(again, rec["image"]), "rb") as b:
            assert a.read() == b.read()
    other = [sample(i, 4, "train") for i in range(20)]
    assert [s.key for s, _, _ in other] != [Scene.from_json(r["scene"]).key for r in first]
    s1, q1, im1 = sample(7, 3, "train")
    s2, q2, im2 = sample(7, 3, "train")
    assert (s1, q1) == (s2, q2) and np.array_equal(np.asarray(im1), np.asarray(im2))


def test_bad_input_and_cli(tmp_path, capsys):
    with pytest.raises(ValueError, match="split"):
        sample(0, 0, "test")
    with pytest.raises(ValueError, match="unknown question types"):
        build_vqa_dataset(str(tmp_path / "x"), count=2, types=("colour", "size"))
    assert not (tmp_path / "x").exists()
    assert cli([str(tmp_path / "cli"), "--count", "5", "--split", "heldout", "--types", "count"]) == 0
    recs = json.loads((tmp_path / "cli" / "annotations.json").read_text())
    assert [r["question_type"] for r in recs] == ["count"] * 5
    assert cli([str(tmp_path / "cli"), "--count", "5"]) == 2  # exists, not empty
    assert "not empty" in capsys.readouterr().err


def test_accuracy_scores_single_choice():
    recs = [{"answer": "B", "question_type": "colour"}, {"answer": "C", "question_type": "count"},
            {"answer": "A", "question_type": "count"}]
    done = ["<think>\nx\n</think>\n\n<answer> b </answer>", "<answer>C</answer><answer>D</answer>", "D"]
    assert accuracy(recs, done) == {"accuracy": 2 / 3, "accuracy/colour": 1.0, "accuracy/count": 0.5}
    with pytest.raises(ValueError, match="completions"):
        accuracy(recs, done[:2])
