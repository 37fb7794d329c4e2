"""`vqa_look`: a text reward for the tiny VQA world (wfm_jax.worlds.vqa) that a wrong look cannot
earn by chance.

`single_choice` rewards the letter alone. On this world a completion that thinks about the wrong
cell still gets its letter right whenever that cell holds the same colour or shape, and GRPO then
reinforces the wrong look along with the right letter (docs/reason2_post_training.md, sessions 14
and 26). `vqa_look` is 1 only when the letter is the reference's AND the think is what the world's
"look" target thinks: the question's subject and the reference option's text
(`northeast red`, `background white`, `most blue`, `red 2`), as `Question.target_in("look")`
writes it. Everything it needs is in the prompt (the question sentence and the lettered options)
and the reference letter, so it also runs behind the reward service.

A prompt that is not a VQA-world question is a RewardValueError naming it, never a silent 0.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from reward_client.errors import RewardValueError
from reward_client.reason import extract_answer, references_of, single_choice_reward
from reward_client.registry import register_reward

# the world's question sentences (wfm_jax/worlds/vqa/scenes.py `ask`) -> the subject the look names
_SUBJECTS = (
    (re.compile(r"What colour is the shape in the (\w+) cell\?"), None),
    (re.compile(r"What is in the (\w+) cell\?"), None),
    (re.compile(r"What colour is the background\?"), "background"),
    (re.compile(r"Which colour do most shapes have\?"), "most"),
    (re.compile(r"How many (\w+) shapes are there\?"), None),
)
_OPTION = re.compile(r"^([A-D])\. (.+?)\s*$", re.MULTILINE)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def expected_look(prompt: str, reference: str) -> str:
    """The think the world's look target has for this question: "<subject> <answer text>"."""
    subject = None
    for pattern, fixed in _SUBJECTS:
        m = pattern.search(prompt)
        if m:
            subject = fixed or m.group(1)
            break
    options = dict(_OPTION.findall(prompt))
    letter = extract_answer(reference).upper()
    if subject is None or letter not in options:
        raise RewardValueError(f"vqa_look: not a tiny VQA world question with option {letter!r}: "
                               f"{prompt[:80]!r}")
    return f"{subject} {options[letter]}"


def vqa_look_reward(completion: str, prompt: str, reference: str) -> float:
    expected = expected_look(prompt, reference)  # first: a prompt it cannot read always raises
    think = _THINK.search(completion)
    if think is None or not single_choice_reward(completion, reference):
        return 0.0
    return 1.0 if " ".join(think.group(1).split()) == expected else 0.0


@register_reward("vqa_look", media="text")
def vqa_look_batch(completions: Sequence[str], prompts: Sequence[str], extras) -> np.ndarray:
    references = references_of("vqa_look", extras, len(completions))
    if len(prompts) != len(completions):
        raise RewardValueError(f"vqa_look: {len(prompts)} prompts for {len(completions)} completions")
    return np.asarray([vqa_look_reward(c, p, r) for c, p, r in zip(completions, prompts, references,
                                                                     strict=True)], np.float64)
