"""`vqa_look` (reward_client/vqa.py) against the VQA world's own questions: the world writes the
look target (`Question.target_in("look")`) and the prompt; the reward must give 1 to that target
alone, for every question type, shuffled or fixed options, inside a chat template."""
from __future__ import annotations

import numpy as np
import pytest

from reward_client.catalog import get_reward
from reward_client.errors import RewardValueError
from wfm_jax.worlds.vqa import scenes


def _questions(n: int = 60):
    rng = np.random.default_rng(0)
    for i in range(n):
        scene = scenes.random_scene(rng)
        for kind in scenes.QUESTION_TYPES:
            yield scenes.ask(scene, kind, rng, shuffle=bool(i % 2))


def _score(completions, prompts, references):
    return get_reward("vqa_look").fn(completions, prompts, {"references": references})


def test_only_the_right_look_with_the_right_letter_is_rewarded():
    cases = []  # (completion, prompt, reference, expected)
    for q in _questions():
        prompt = f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{q.prompt}<|im_end|>\n"
        look = q.target_in("look")
        other = next(o for o in q.options if o != q.answer)
        wrong_letter = scenes.LETTERS[(scenes.LETTERS.index(q.letter) + 1) % 4]
        cases += [
            (look, prompt, q.letter, 1.0),
            (look.replace(f"\n{q.subject} ", f"\n  {q.subject}   ", 1), prompt, q.letter, 1.0),  # spacing
            (look, prompt, f"<answer>{q.letter}</answer>", 1.0),  # a reference in answer tags
            (look.replace(f"<answer>{q.letter}", f"<answer>{wrong_letter}"), prompt, q.letter, 0.0),
            (q.target_in("fixed"), prompt, q.letter, 0.0),  # right letter, no look
            (look.replace(f"{q.subject} {q.answer}", f"{q.subject} {other}"), prompt, q.letter, 0.0),
            (look.replace(f"{q.subject} ", "elsewhere ", 1), prompt, q.letter, 0.0),  # wrong subject
            (f"<answer>{q.letter}</answer>", prompt, q.letter, 0.0),  # no think at all
        ]
    completions, prompts, references, expected = zip(*cases, strict=True)
    np.testing.assert_array_equal(_score(completions, prompts, references), expected)


def test_a_question_from_elsewhere_is_one_clear_error():
    with pytest.raises(RewardValueError, match="vqa_look: not a tiny VQA world question"):
        _score(["<think>\nx\n</think>\n\n<answer>A</answer>"], ["What is 2 + 2?\nA. 4\nB. 5"], ["A"])
    q = next(_questions(1))
    with pytest.raises(RewardValueError, match="option 'E'"):
        _score([q.target_in("look")], [q.prompt], ["E"])
    with pytest.raises(RewardValueError, match="needs the reference answers"):
        get_reward("vqa_look").fn([q.target_in("look")], [q.prompt], {})
