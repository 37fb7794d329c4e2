"""metrics.jsonl gets train/reward_{key}_mean for each extra key a reward answers (item 6):
the RL loop's advantage step on a hand-made rollout, scored by a real RewardComputer."""
from types import SimpleNamespace

import numpy as np
from PIL import Image, ImageDraw

from reward_client.computer import RewardComputer
from wfm_jax.algorithms.advantages import group_advantages
from wfm_jax.train.rl import advantages_for
from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS


def _image(colour):
    image = Image.new("RGB", (32, 32), BACKGROUNDS["white"])
    ImageDraw.Draw(image).rectangle([8, 8, 24, 24], fill=COLOURS[colour])
    return np.asarray(image)


def test_extra_reward_keys_become_per_key_metrics():
    images = np.stack([_image("red"), _image("red"), _image("blue"), _image("blue")])
    prompts = ["a red square on a white background"] * 2 + ["a red circle on a black background"] * 2
    with RewardComputer([{"name": "shapes_alignment", "local": True}]) as rc:
        res = rc.score(images, prompts)
    rollout = {"reward": res.total, "keep": res.keep, "per_fn": res.per_fn, "extra": res.extra,
               "dropped_groups": 0}
    # the base class's group advantages (RLAlgorithm.advantages), the rest of a run unused here
    algo = SimpleNamespace(advantages=group_advantages)
    run = SimpleNamespace(algo=algo, global_std=True, std_ddof=0, adv_range=(-5.0, 5.0))
    _, metrics = advantages_for(run, rollout, {"group": np.array([0, 0, 1, 1])})
    assert metrics["train/reward_colour_mean"] == 0.5  # blue where red was asked: 2 of 4
    assert metrics["train/reward_background_mean"] == 0.5
    assert metrics["train/reward_shape_mean"] == 0.5
    assert metrics["train/reward_count_mean"] == 1.0
    assert metrics["train/reward_shapes_alignment_mean"] == metrics["train/reward_mean"]
    np.testing.assert_allclose(metrics["train/reward_mean"], np.mean([1.0, 1.0, 0.25, 0.25]))
