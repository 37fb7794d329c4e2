"""The shapes dataset: deterministic in its seed, ground truth in each JSON that matches the
pixels, held-out scenes never in the train split."""
import filecmp
import json
import os

import numpy as np
import pytest
from PIL import Image

from wfm_jax.worlds.shapes import dataset as tiny_dataset
from wfm_jax.worlds.shapes.detector import accuracy
from wfm_jax.worlds.shapes.grammar import (
    BACKGROUNDS,
    COLOURS,
    FIXED_JITTER,
    FIXED_LAYOUTS,
    SIZE_HALF,
    SIZES,
    SPLIT_SCENES,
    all_scenes,
    heldout_scenes,
    parse_prompt,
    train_scenes,
)


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


def test_fixed_layout_places_each_count_at_its_places(tmp_path):
    """--layout fixed: every box of a count centred within FIXED_JITTER px of its place, at the
    large size of an unsized scene; the ground truth still matches the pixels."""
    d = tiny_dataset.build_shapes_dataset(str(tmp_path / "f"), count=72, size=32, seed=3,
                                          split="all", layout="fixed")
    for i in range(72):
        rec = json.load(open(os.path.join(d, f"{i:04d}.json")))
        image = np.asarray(Image.open(os.path.join(d, f"{i:04d}.png")).convert("RGB"))
        assert "size" not in rec
        for (x0, y0, x1, y1), (cx, cy) in zip(rec["boxes"], FIXED_LAYOUTS[rec["count"]], strict=True):
            assert abs((x0 + x1) / 2 - cx * 32) <= FIXED_JITTER + 0.01
            assert abs((y0 + y1) / 2 - cy * 32) <= FIXED_JITTER + 0.01
            assert abs((x1 - x0) - 2 * 32 * SIZE_HALF[rec["count"]][1]) < 0.02
            centre = image[int((y0 + y1) / 2) + 1, int((x0 + x1) / 2)]
            assert tuple(centre) == COLOURS[rec["colour"]]
    with pytest.raises(ValueError, match="layout"):
        tiny_dataset.build_shapes_dataset(str(tmp_path / "x"), layout="grid")


def test_small_draws_both_sizes_and_never_says_which(tmp_path):
    """small=P: about P of the images drawn small, captions of the unsized grammar, the record
    saying the drawn size; the detector's size reading agrees with the record."""
    d = tiny_dataset.build_shapes_dataset(str(tmp_path / "s"), count=120, size=32, seed=0,
                                          layout="fixed", small=0.3)
    sizes, images, asked = [], [], []
    for i in range(120):
        rec = json.load(open(os.path.join(d, f"{i:04d}.json")))
        assert parse_prompt(rec["prompt"]).size is None
        side = rec["boxes"][0][2] - rec["boxes"][0][0]
        assert abs(side - 2 * 32 * SIZE_HALF[rec["count"]][SIZES.index(rec["size"])]) < 0.02
        sizes.append(rec["size"])
        images.append(np.asarray(Image.open(os.path.join(d, f"{i:04d}.png")).convert("RGB")))
        asked.append(parse_prompt(rec["prompt"]).sized(rec["size"]).prompt)
    assert 0.2 <= sizes.count("small") / 120 <= 0.4
    assert accuracy(np.stack(images), asked)["size"] == 1.0
    with pytest.raises(ValueError, match="probability"):
        tiny_dataset.build_shapes_dataset(str(tmp_path / "x"), small=1.5)


def test_sized_split_captions_say_the_drawn_size(tmp_path):
    """DDRL's data in the sized world: split train_sized, layout fixed; each caption asks the
    size its image shows (tiny_ddrl's build_tiny_split / build_tiny_layout)."""
    d = tiny_dataset.build_shapes_dataset(str(tmp_path / "t"), count=24, size=32, seed=0,
                                          split="train_sized", layout="fixed")
    recs = [json.load(open(os.path.join(d, f"{i:04d}.json"))) for i in range(24)]
    assert {r["size"] for r in recs} == set(SIZES)
    assert all(parse_prompt(r["prompt"]).size == r["size"] for r in recs)
    images = np.stack([np.asarray(Image.open(os.path.join(d, f"{i:04d}.png")).convert("RGB"))
                       for i in range(24)])
    assert accuracy(images, [r["prompt"] for r in recs])["size"] == 1.0


def test_recipe_build_makes_its_count_and_refuses_a_folder_of_another(tmp_path):
    """train.train_policy.dataset.build_tiny_count: the recipe's dataset is built with that many
    items; an existing folder holding another number is one line, not a silent smaller run."""
    from wfm_jax.config.recipe import ConfigError, load_config
    from wfm_jax.data import DataError
    from wfm_jax.data.records import ensure_tiny_dataset

    def config(count):  # a local_dir given on the command line is built only when asked
        return load_config("configs/tiny_ddrl.py", [
            ("train.train_policy.dataset.local_dir", str(tmp_path / "d")),
            ("train.train_policy.dataset.build_tiny", "True"),
            ("train.train_policy.dataset.build_tiny_count", str(count))])

    ensure_tiny_dataset(config(20))
    assert tiny_dataset.item_count(str(tmp_path / "d")) == 20
    # the recipe's own count draws each of its split's prompts once (tiny_ddrl: the 120 that
    # tiny_nft and tiny_grpo sample)
    recipe = load_config("configs/tiny_ddrl.py")
    ds = recipe.train.train_policy.dataset
    full = tiny_dataset.build_shapes_dataset(str(tmp_path / "full"), count=ds.build_tiny_count,
                                             split=ds.build_tiny_split, layout=ds.build_tiny_layout)
    prompts = [json.load(open(os.path.join(full, f"{i:04d}.json")))["prompt"]
               for i in range(ds.build_tiny_count)]
    assert sorted(prompts) == sorted(s.prompt for s in SPLIT_SCENES["train_sized"]())
    recs = [json.load(open(tmp_path / "d" / f"{i:04d}.json")) for i in range(20)]
    assert all(parse_prompt(r["prompt"]).size == r["size"] for r in recs)  # the recipe's split
    ensure_tiny_dataset(config(20))  # present: kept
    with pytest.raises(DataError, match="holds 20 items but build_tiny_count asks 16"):
        ensure_tiny_dataset(config(16))
    with pytest.raises(ConfigError, match="build_tiny_count' must be > 0"):
        config(0)
