"""Recipes that leave train.max_steps unset run train.epoch passes over their data, by
cosmos-rl's rule (config/run_length.py), through the real trainer entry on the toy family: the
last step in metrics.jsonl, the length in config.json and the cosine schedule all follow it."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from tests.families.test_toy_family import (  # noqa: F401 (fixtures)
    SIZE,
    brightness_reward,
    metrics,
    toy_family,
    toy_settings,
    write_recipe,
)
from wfm_jax.cli import main as wmain

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("toy_family")]


def _images(directory, count: int) -> str:
    os.makedirs(directory)
    for i in range(count):
        Image.fromarray(np.full((SIZE, SIZE, 3), 10 * i, np.uint8)).save(os.path.join(directory, f"{i}.png"))
        with open(os.path.join(directory, f"{i}.json"), "w") as f:
            json.dump({"prompt": f"grey {i}"}, f)
    return str(directory)


def _stored_steps(out) -> int:
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f)["train"]["max_steps"]


def test_sft_runs_two_epochs(tmp_path):
    """20 images, batches of 8, 2 epochs: floor(20 / 8) x 2 = 4 steps; the cosine spans them."""
    lr = 0.1
    recipe = write_recipe(tmp_path / "toy_sft.py", **toy_settings(
        tmp_path, **{"train.train_policy.dataset.local_dir": _images(tmp_path / "data", 20),
                     "train.epoch": 2, "train.train_batch_per_replica": 8, "train.optm_lr": lr,
                     "train.lr_schedule": "cosine", "train.optm_warmup_steps": 0,
                     "train.ckpt.export_safetensors": False}))
    assert wmain.main(["--config", recipe]) == 0
    m = metrics(tmp_path / "out")
    assert sorted(m) == [1, 2, 3, 4] and _stored_steps(tmp_path / "out") == 4
    # the last update's rate: count 3 of a 4-update cosine
    assert m[4]["train/learning_rate"] == pytest.approx(lr * 0.5 * (1 + math.cos(math.pi * 3 / 4)))


@pytest.mark.usefixtures("brightness_reward")
def test_nft_runs_two_epochs(tmp_path):
    """6 prompts x 4 samples x 2 epochs in batches of 16 rows: 48 // 16 = 3 steps."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"grey {i}\n" for i in range(6)))
    recipe = write_recipe(tmp_path / "toy_nft.py", **toy_settings(
        tmp_path, **{"train.train_policy.type": "nft", "train.epoch": 2,
                     "train.train_policy.dataset.local_dir": str(prompts),
                     "train.train_policy.use_remote_reward": False,
                     "train.train_policy.remote_reward.reward_fns": [
                         {"name": "toy_brightness", "weight": 1.0, "score_key": ""}],
                     "train.train_batch_per_replica": 16, "train.train_policy.mini_batch": 2,
                     "rollout.n_generation": 4, "policy.diffusers.sample.eval_num_steps": 3,
                     "train.optm_lr": 0.01, "train.ckpt.export_safetensors": False}))
    assert wmain.main(["--config", recipe]) == 0
    assert sorted(metrics(tmp_path / "out")) == [1, 2, 3]
    assert _stored_steps(tmp_path / "out") == 3
