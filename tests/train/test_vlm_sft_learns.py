"""The tiny VLM SFT recipe learns the VQA world (issue 34, acceptance: held-out accuracy from
chance to >= 0.6): configs/tiny_vlm_sft.py as a user runs it (the base model pre-trained and the
data built in a temp dir), then the held-out accuracy before and after, against baselines computed
from the data: chance (one option in four) and the best answer that ignores the picture (each
question type's most frequent training letter, applied to the held-out questions); and the colour
questions, which only reading the named cell answers. The recipe's 1600 steps make this the suite's
longest test (about 7-12 min with the other worker busy, sessions 36-38)."""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.config import recipe as cfg
from wfm_jax.train import vlm_sft
from wfm_jax.worlds.vqa.dataset import load_records

pytestmark = pytest.mark.slow
CHANCE = 0.25  # four options


def majority_baseline(train: list[dict], heldout: list[dict]) -> float:
    """Held-out accuracy of always answering the most frequent training letter."""
    top = Counter(r["answer"] for r in train).most_common(1)[0][0]
    return sum(r["answer"] == top for r in heldout) / len(heldout)


def blind_baseline(train: list[dict], heldout: list[dict]) -> float:
    """Held-out accuracy of answering each question type's most frequent training letter."""
    best = {}
    for kind in {r["question_type"] for r in train}:
        best[kind] = Counter(r["answer"] for r in train if r["question_type"] == kind).most_common(1)[0][0]
    return sum(best.get(r["question_type"]) == r["answer"] for r in heldout) / len(heldout)


def test_tiny_vlm_sft_recipe_learns_well_above_blind_answers(tmp_path):
    root = str(tmp_path)
    config = cfg.load_config(os.path.join(REPO_ROOT, "configs", "tiny_vlm_sft.py"), [
        ("train.output_dir", f"{root}/out"), ("policy.model_name_or_path", f"{root}/base"),
        ("train.train_policy.dataset.local_dir", f"{root}/train"),
        ("validation.dataset.local_dir", f"{root}/heldout"),
        ("train.ckpt.export_safetensors", "False"), ("train.ckpt.save_freq", "100000")])
    steps = vlm_sft.run(config)
    assert steps == config.train.max_steps
    with open(os.path.join(root, "out", "metrics.jsonl")) as f:
        val = [r for r in map(json.loads, f) if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, steps]
    before, after = val[0]["val/accuracy"], val[1]["val/accuracy"]
    train, heldout = load_records(f"{root}/train"), load_records(f"{root}/heldout")
    majority, blind = majority_baseline(train, heldout), blind_baseline(train, heldout)
    print(f"val/accuracy {before:.3f} -> {after:.3f}; majority letter {majority:.3f}, per-type blind {blind:.3f}")
    assert before <= CHANCE + 0.1  # the random base model does not know the answers
    assert after >= 0.6  # issue 34's bar
    assert after >= max(CHANCE, majority) + 0.25  # well above chance and the majority answer
    # above the best answer that ignores the picture (0.531). Half the answers think a fixed
    # sentence and then read colour worse (docs/reason2_post_training.md, sessions 35-38): 0.812
    # under this test's flags (session 38), 0.740-0.844 on seeds 0-2 with XLA's default flags;
    # the all-look recipe of sessions 29-34 gave 0.906-0.948
    assert after >= blind + 0.15
    # the named cell is read: its colour well above a picture-blind answer's 0.375 (0.719 here in
    # session 36; 0.719-0.812 on seeds 0-2 with the default flags, session 38)
    assert val[1]["val/accuracy/colour"] >= 0.55
    assert not os.path.exists(f"{root}/base.pretrain")  # the base's work dir went once it was built
