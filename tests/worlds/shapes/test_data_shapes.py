"""The shapes dataset: deterministic in its seed, ground truth in each JSON that matches the
pixels, held-out scenes never in the train split."""
import filecmp
import json
import os

import numpy as np
import pytest
from PIL import Image

from wfm_jax.worlds.shapes import dataset as tiny_dataset
from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS, all_scenes, heldout_scenes, parse_prompt, train_scenes


def test_same_seed_same_bytes_other_seed_other_images(tmp_path):
    a = tiny_dataset.build_shapes_dataset(str(tmp_path / "a"), count=12, size=32, seed=5)
    b = tiny_dataset.build_shapes_dataset(str(tmp_path / "b"), count=12, size=32, seed=5)
    c = tiny_dataset.build_shapes_dataset(str(tmp_path / "c"), count=12, size=32, seed=6)
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b)) and len(names) == 24
    assert all(filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)
    assert not all(filecmp.cmp(os.path.join(a, n), os.path.join(c, n), shallow=False) for n in names)


def test_ground_truth_matches_prompt_and_pixels(tmp_path):
    d = tiny_dataset.build_shapes_dataset(str(tmp_path / "d"), count=72, size=32, seed=0, split="all")
    prompts = set()
    for i in range(72):
        rec = json.load(open(os.path.join(d, f"{i:04d}.json")))
        image = np.asarray(Image.open(os.path.join(d, f"{i:04d}.png")).convert("RGB"))
        scene = parse_prompt(rec["prompt"])
        assert (rec["colour"], rec["shape"], rec["count"], rec["background"]) == \
            (scene.colour, scene.shape, scene.count, scene.background)
        assert len(rec["boxes"]) == rec["count"]
        assert tuple(image[0, 0]) == BACKGROUNDS[rec["background"]]
        for x0, y0, x1, y1 in rec["boxes"]:
            assert 0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 32
            centre = image[int((y0 + y1) / 2) + 1, int((x0 + x1) / 2)]  # +1: inside a triangle too
            assert tuple(centre) == COLOURS[rec["colour"]]
        prompts.add(rec["prompt"])
    assert len(prompts) == 72  # 72 samples of 'all' cover every scene once


def test_heldout_scenes_are_not_in_train():
    held, train = set(heldout_scenes()), set(train_scenes())
    assert len(held) == 12 and len(train) == 60 and not held & train
    assert held | train == set(all_scenes())
    assert {s.colour for s in held} == set(COLOURS)


def test_bad_split_and_command_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="split"):
        tiny_dataset.build_shapes_dataset(str(tmp_path / "x"), split="test")
    assert tiny_dataset.main([str(tmp_path / "y"), "--count", "3", "--split", "heldout"]) == 0
    assert len(os.listdir(tmp_path / "y")) == 6
    assert tiny_dataset.main([str(tmp_path / "y")]) == 2
    assert "not empty" in capsys.readouterr().err
