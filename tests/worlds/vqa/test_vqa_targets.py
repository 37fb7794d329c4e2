"""The VQA world's SFT target styles: both keep cosmos-rl's format (its `format` and
`single_choice` rewards score them 1); "answer" thinks the correct option's text."""
from __future__ import annotations

import pytest

from reward_client.reason import format_reward, single_choice_reward
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset, load_records


@pytest.mark.parametrize("style", ["fixed", "answer"])
def test_target_styles_keep_cosmos_format(tmp_path, style):
    records = load_records(build_vqa_dataset(str(tmp_path / style), count=10, split="train", seed=2,
                                             target=style))
    for rec in records:
        target = rec["conversations"][1]["value"]
        assert format_reward(target) == 1.0
        assert single_choice_reward(target, rec["answer"]) == 1.0
        think = target.split("</think>")[0].removeprefix("<think>\n").strip()
        assert (think == f"the answer is {rec['answer_text']}") == (style == "answer")
        assert rec["options"]["ABCD".index(rec["answer"])] == rec["answer_text"]


def test_unknown_target_style_is_refused(tmp_path):
    with pytest.raises(ValueError, match="target style 'long'"):
        build_vqa_dataset(str(tmp_path / "x"), count=2, target="long")
    assert not (tmp_path / "x").exists()
