"""RL prompt datasets (flow_grpo / DiffusionNFT layout) and their train / validation split.

- `.txt`: one prompt per line; blank lines are skipped (pickscore, ocr, drawbench).
- `.jsonl`: one JSON object per line with a "prompt" (geneval `*_metadata.jsonl`); the whole object
  travels with the prompt as its metadata, for the reward service.
- A directory: `train.txt | train_metadata.jsonl | train.jsonl`, and the same names with `test`
  for validation.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from wfm_jax.data.errors import DataError

TRAIN_NAMES = ("train.txt", "train_metadata.jsonl", "train.jsonl")
TEST_NAMES = ("test.txt", "test_metadata.jsonl", "test.jsonl")


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    prompt: str
    metadata: dict = dataclasses.field(default_factory=dict)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise DataError(f"cannot read prompt file {path}: {reason}") from e


def _from_jsonl(path: str, lines: list[str]) -> list[PromptRecord]:
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: not valid JSON ({e.msg})") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise DataError(f'{path}:{number}: expected a JSON object with a "prompt" string')
        records.append(PromptRecord(obj["prompt"], obj))
    return records


def read_prompt_file(path: str) -> list[PromptRecord]:
    """Prompts of one file; a missing, unreadable or empty file is a DataError naming it."""
    if not os.path.isfile(path):
        raise DataError(f"prompt file not found: {path}")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".txt", ".jsonl"):
        raise DataError(f"unsupported prompt file {path} (expected .txt or .jsonl)")
    lines = _read_lines(path)
    if ext == ".txt":
        records = [PromptRecord(line.strip()) for line in lines if line.strip()]
    else:
        records = _from_jsonl(path, lines)
    if not records:
        raise DataError(f"prompt file {path} is empty")
    return records


def find_prompt_file(path: str, split: str) -> str | None:
    """A file is itself; a directory is searched for the split's usual file names."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise DataError(f"prompt dataset not found: '{path}'")
    for name in TRAIN_NAMES if split == "train" else TEST_NAMES:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    if split == "train":
        raise DataError(f"no {' | '.join(TRAIN_NAMES)} in prompt dataset dir {path}")
    return None


def holdout_split(records: list, fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic held-out fraction (at least one record); both parts keep file order."""
    n_val = max(1, round(len(records) * fraction))
    if n_val >= len(records):
        raise DataError(f"holdout_fraction={fraction} of {len(records)} prompts leaves none to train on")
    held = set(np.random.default_rng(seed).permutation(len(records))[:n_val].tolist())
    train = [r for i, r in enumerate(records) if i not in held]
    val = [r for i, r in enumerate(records) if i in held]
    return train, val


def prompt_splits(train_path: str, validation_path: str = "", holdout_fraction: float = 0.0,
                  seed: int = 0) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, validation). Validation comes from `validation_path` if given, else a held-out
    fraction of train if > 0, else the train dir's test file, else it is empty."""
    if not train_path:
        raise DataError("no prompt dataset given (train.train_policy.dataset.local_dir)")
    train = read_prompt_file(find_prompt_file(train_path, "train"))
    if validation_path:
        found = find_prompt_file(validation_path, "test")
        if found is None:
            raise DataError(f"no {' | '.join(TEST_NAMES)} in validation dir {validation_path}")
        return train, read_prompt_file(found)
    if holdout_fraction > 0:
        return holdout_split(train, holdout_fraction, seed)
    test = find_prompt_file(train_path, "test") if os.path.isdir(train_path) else None
    return train, (read_prompt_file(test) if test else [])


def prompt_splits_from_config(config) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Keys: train.train_policy.dataset.local_dir, validation.dataset.{local_dir,
    holdout_fraction}, train.seed."""
    return prompt_splits(config.train.train_policy.dataset.local_dir,
                         config.validation.dataset.local_dir,
                         config.validation.dataset.holdout_fraction, config.train.seed)
