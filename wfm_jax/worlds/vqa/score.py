"""Scoring completions on the VQA world: cosmos-rl's `single_choice` rule (specs/reason2.md §4.3)
reduced to accuracy, overall and per question type."""
from __future__ import annotations

import re
from collections.abc import Sequence

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The stripped inside of the first <answer>...</answer>, else the stripped text."""
    m = _ANSWER.search(text)
    return (m.group(1) if m else text).strip()


def accuracy(records: Sequence[dict], completions: Sequence[str]) -> dict[str, float]:
    """{"accuracy": overall, "accuracy/<question_type>": per type} against each record's letter."""
    if len(records) != len(completions):
        raise ValueError(f"{len(records)} records but {len(completions)} completions")
    if not records:
        raise ValueError("no records to score")
    hits: dict[str, list[bool]] = {}
    for rec, text in zip(records, completions, strict=True):
        ok = extract_answer(text).lower() == rec["answer"].strip().lower()
        hits.setdefault("accuracy", []).append(ok)
        hits.setdefault(f"accuracy/{rec['question_type']}", []).append(ok)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}
