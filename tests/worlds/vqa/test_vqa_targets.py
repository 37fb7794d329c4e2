"""The VQA world's SFT target styles: all keep cosmos-rl's format (its `format` and
`single_choice` rewards score them 1); "answer" thinks the correct option's text, "look" what the
question looks at (one word, taken from the question) and then that text. The base model's
description set names every cell's content."""
from __future__ import annotations

import os

import pytest

from reward_client.reason import format_reward, single_choice_reward
from wfm_jax.worlds.vqa.dataset import build_description_dataset, build_vqa_dataset, ensure_vqa_dataset, load_records

CELLS = ["northwest", "north", "northeast", "west", "centre", "east", "southwest", "south", "southeast"]


@pytest.mark.parametrize("style", ["fixed", "answer", "look"])
def test_target_styles_keep_cosmos_format(tmp_path, style):
    records = load_records(build_vqa_dataset(str(tmp_path / style), count=10, split="train", seed=2,
                                             target=style))
    for rec in records:
        target = rec["conversations"][1]["value"]
        assert format_reward(target) == 1.0
        assert single_choice_reward(target, rec["answer"]) == 1.0
        think = target.split("</think>")[0].removeprefix("<think>\n").strip()
        assert (think == f"the answer is {rec['answer_text']}") == (style == "answer")
        if style == "look":
            subject, answer = think.split(" ")
            assert answer == rec["answer_text"]
            question = rec["conversations"][0]["value"].split("\n")[1]
            assert subject in question.replace("?", "").split(" ") or (
                rec["question_type"] == "most_frequent" and subject == "most")
        assert rec["options"]["ABCD".index(rec["answer"])] == rec["answer_text"]


def test_fixed_think_fraction_mixes_styles_and_keeps_the_questions(tmp_path):
    """Mixed reasoning: a share of the answers think the fixed sentence, the rest the target style;
    each record names its style, the draw is per record (the same records get it in a longer set),
    and the scenes, questions and pictures are those of the unmixed set."""
    kw = dict(split="train", seed=3, target="look", options="fixed")
    pure = load_records(build_vqa_dataset(str(tmp_path / "pure"), count=60, **kw))
    mixed_dir = build_vqa_dataset(str(tmp_path / "mixed"), count=60, fixed_think_fraction=0.5, **kw)
    mixed = load_records(mixed_dir)
    longer = load_records(build_vqa_dataset(str(tmp_path / "longer"), count=80, fixed_think_fraction=0.5, **kw))
    assert {r["think_style"] for r in pure} == {"look"}
    styles = [r["think_style"] for r in mixed]
    assert 15 <= styles.count("fixed") <= 45 and set(styles) == {"look", "fixed"}  # a draw, not every other
    assert styles == [r["think_style"] for r in longer[:60]]
    for p, m in zip(pure, mixed, strict=True):
        assert {k: v for k, v in p.items() if k not in ("conversations", "think_style")} == {
            k: v for k, v in m.items() if k not in ("conversations", "think_style")}
        assert p["conversations"][0] == m["conversations"][0]
        target = m["conversations"][1]["value"]
        think = target.split("</think>")[0].removeprefix("<think>\n").strip()
        if m["think_style"] == "fixed":
            assert think == "I look at the image."
        else:
            assert target == p["conversations"][1]["value"]
        assert single_choice_reward(target, m["answer"]) == 1.0 and format_reward(target) == 1.0
        with open(os.path.join(tmp_path, "pure", p["image"]), "rb") as f1, open(os.path.join(mixed_dir, m["image"]), "rb") as f2:
            assert f1.read() == f2.read()
    every = load_records(build_vqa_dataset(str(tmp_path / "every"), count=10, fixed_think_fraction=1.0, **kw))
    assert {r["think_style"] for r in every} == {"fixed"}
    with pytest.raises(ValueError, match=r"fixed_think_fraction must be within \[0, 1\], got -0.1"):
        build_vqa_dataset(str(tmp_path / "bad"), count=2, fixed_think_fraction=-0.1)
    assert not (tmp_path / "bad").exists()


def test_unknown_target_style_is_refused(tmp_path):
    with pytest.raises(ValueError, match="target style 'long'"):
        build_vqa_dataset(str(tmp_path / "x"), count=2, target="long")
    assert not (tmp_path / "x").exists()


def test_fixed_option_order_keeps_scenes_and_answers(tmp_path):
    """"fixed": every question type lists its options in one order across the data set (so an
    answer word always has one letter); the scenes, pictures and answer texts equal the shuffled
    set's, only the options' order (and so the letter) differs."""
    kw = dict(count=20, split="train", seed=2, types=("colour", "shape", "background", "count"))
    shuffled = build_vqa_dataset(str(tmp_path / "shuffled"), **kw)
    fixed = build_vqa_dataset(str(tmp_path / "fixed"), options="fixed", **kw)
    a, b = load_records(shuffled), load_records(fixed)
    orders: dict[str, set] = {}
    for rs, rf in zip(a, b, strict=True):
        assert (rs["scene"], rs["answer_text"], rs["question_type"]) == (rf["scene"], rf["answer_text"],
                                                                          rf["question_type"])
        assert sorted(rs["options"]) == sorted(rf["options"])
        assert rf["options"]["ABCD".index(rf["answer"])] == rf["answer_text"]
        orders.setdefault(rf["question_type"], set()).add(tuple(rf["options"]))
        with open(os.path.join(shuffled, rs["image"]), "rb") as f1, open(os.path.join(fixed, rf["image"]), "rb") as f2:
            assert f1.read() == f2.read()
    assert all(len(o) == 1 for o in orders.values()), orders
    assert len({tuple(r["options"]) for r in a if r["question_type"] == "colour"}) > 1  # shuffled does shuffle


def test_unknown_option_order_is_refused(tmp_path):
    with pytest.raises(ValueError, match="option order 'sorted'"):
        build_vqa_dataset(str(tmp_path / "x"), count=2, options="sorted")
    assert not (tmp_path / "x").exists()


def test_description_set_names_every_cell(tmp_path):
    records = load_records(build_description_dataset(str(tmp_path / "d"), count=12, seed=4))
    assert len(records) == 12
    for rec in records:
        assert rec["conversations"][0]["value"] == "<image>\nWhat is in the picture?"
        lines = rec["conversations"][1]["value"].split("\n")
        cells = rec["scene"]["cells"]
        assert lines[:9] == [f"{n} nothing" if c is None else f"{n} {c[0]} {c[1]}" for n, c in zip(CELLS, cells)]
        assert lines[9] == f"background {rec['scene']['background']}"
        assert os.path.isfile(os.path.join(tmp_path, "d", rec["image"]))


def test_a_set_built_with_other_settings_is_refused_not_reused(tmp_path):
    """ensure_vqa_dataset keeps a set built with the asked settings and refuses, in one line, one
    built with another think-style mix, count, seed or question types (before, any set was reused)."""
    kw = dict(count=12, split="train", seed=2, types=("colour", "shape"), target="look", options="fixed",
              fixed_think_fraction=0.5)
    built = ensure_vqa_dataset(str(tmp_path / "set"), **kw)
    assert ensure_vqa_dataset(built, **kw) == built  # the same settings: reused as it is
    for change, words in (({"fixed_think_fraction": 0.0}, "answers think in another style"),
                          ({"target": "answer"}, "answers think in another style"),
                          ({"count": 24}, "12 records from 'train-2-000000', not 24"),
                          ({"seed": 3}, "not 12 from 'train-3-000000'"),
                          ({"types": ("colour",)}, "question types ['shape'] not in ['colour']")):
        with pytest.raises(ValueError, match="built with other settings") as err:
            ensure_vqa_dataset(built, **{**kw, **change})
        assert words in str(err.value) and "\n" not in str(err.value)
