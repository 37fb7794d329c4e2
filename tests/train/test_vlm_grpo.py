"""The Qwen3-VL GRPO loop end to end on the tiny VQA world (spec-size random model, 2 steps): finite
rewards, losses and val/accuracy in metrics.jsonl, real updates (a length-based reward makes the
groups informative for a random model, beside format and single_choice), an export; a run killed
with SIGKILL at its last step (that step's asynchronous save in flight, its export not begun) and
resumed logs the same metrics and ends with the same weights as the uninterrupted run. Also the
helpers: completion masks, the recipe file, one-line errors."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from reward_client.registry import register_reward, unregister_reward
from tests._support.paths import REPO_ROOT
from tests._support.vqa import tiny_vqa_assets
from tests._support.xla import host_devices
from wfm_jax.config.schema import default_config
from wfm_jax.train import vlm_grpo

# A trainer in its own process that kills itself with SIGKILL once step 2 (the last) is logged: no
# `finally` runs, step 2's asynchronous save is cut short, nothing is exported, as when the OS kills
# a run. Step 1's save is final by then (a save waits for the one before it).
KILL_AT_STEP_2 = """
import os, signal, sys
from tests.train import test_vlm_grpo as t
from wfm_jax.train import vlm_grpo

t.register_test_rewards()
model, train, val, out = sys.argv[1:5]

def die(step, _metrics):
    if step == 2:
        os.kill(os.getpid(), signal.SIGKILL)

vlm_grpo.VLMGRPOTrainer(t._config((model, train, val), out, **{"train.ckpt.save_mode": "async"}),
                        on_step=die).run()
"""


def register_test_rewards() -> None:
    @register_reward("test_length_mod3", media="text", replace=True)
    def length_mod3(completions, prompts, extras):  # varies on random text: groups are kept
        return np.asarray([len(c) % 3 for c in completions], np.float64)

    @register_reward("test_background_only", media="text", replace=True)
    def background_only(completions, prompts, extras):  # varies on the background questions only
        return np.asarray([len(c) % 3 if "background?" in p else 0.0 for c, p in zip(completions, prompts)],
                          np.float64)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm_grpo")
    model, train, val = tiny_vqa_assets(str(root), train_count=12)
    register_test_rewards()
    yield model, train, val
    unregister_reward("test_length_mod3")
    unregister_reward("test_background_only")


def _config(assets, out, **changes):
    model, train, val = assets
    c = default_config()
    c.policy.family = "qwen3_vl"
    c.policy.model_name_or_path = model
    tp = c.train.train_policy
    tp.type = "grpo"
    tp.dataset.layout = "conversations"
    tp.dataset.local_dir = train
    tp.mini_batch = 2
    tp.lm_grpo.max_response_length = 6
    tp.lm_grpo.rewards = ("format", "single_choice", "test_length_mod3")
    tp.lm_grpo.reward_weights = (1.0, 1.0, 0.5)
    c.validation.dataset.local_dir = val
    c.validation.batch_size = 4
    c.train.output_dir = str(out)
    c.train.max_steps = 2
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 8  # 2 prompts x 4; divides over 8 host devices (XLA_FLAGS) or 1
    c.rollout.n_generation = 4
    c.train.optm_lr = 1e-3
    c.train.optm_warmup_steps = 0
    c.train.ckpt.save_freq = 1
    c.train.ckpt.save_mode = "sync"
    c.policy.vlm.max_new_tokens = 4
    c.policy.vlm.pad_to_multiple = 64  # one prompt length: one program
    for key, value in changes.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _strip_time(rec):
    return {k: v for k, v in rec.items() if k != "train/iteration_time"}


@pytest.mark.slow
def test_run_logs_rewards_and_resume_after_kill_matches(assets, tmp_path):
    from converters.qwen3_vl import state_tensors

    whole = tmp_path / "whole"
    trainer = vlm_grpo.VLMGRPOTrainer(_config(assets, whole))
    start = state_tensors(trainer.model())
    assert trainer.run() == 2
    ref = _records(whole)
    assert [r["step"] for r in ref] == [0, 1, 2]
    assert "val/accuracy" in ref[0] and "val/accuracy" in ref[-1]
    for rec in ref[1:]:
        for key in ("train/reward_mean", "train/reward/format", "train/reward/single_choice",
                    "train/reward/test_length_mod3", "train/loss", "train/kept_groups", "optimizer/grad_norm"):
            assert math.isfinite(rec[key]), key
        parts = 1.0 * rec["train/reward/format"] + rec["train/reward/single_choice"] \
            + 0.5 * rec["train/reward/test_length_mod3"]
        assert rec["train/reward_mean"] == pytest.approx(parts, rel=1e-6)
    assert any(r["train/kept_groups"] > 0 and r["optimizer/grad_norm"] > 0 for r in ref[1:])
    final = state_tensors(trainer.model())
    assert any(not np.array_equal(final[k], start[k]) for k in final)  # it trained
    assert (whole / "safetensors" / "step_2" / "model.safetensors").is_file()

    cut = tmp_path / "cut"
    # the worker's device count and compile flags, whatever earlier tests in this worker left in
    # os.environ (the planner's CLI sets its own device count there): other ones round otherwise
    env = dict(os.environ, XLA_FLAGS=host_devices(jax.device_count()), JAX_PLATFORMS="cpu")
    killed = subprocess.run([sys.executable, "-c", KILL_AT_STEP_2, *map(str, assets), str(cut)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert [r["step"] for r in _records(cut)] == [0, 1, 2]  # each record flushed as it is logged
    assert not (cut / "safetensors").exists()
    resumed = vlm_grpo.VLMGRPOTrainer(_config(assets, cut, **{"train.resume": True}))
    assert resumed.start_step == 1  # the half-written step 2 is not a checkpoint
    resumed.run()
    assert [_strip_time(r) for r in _records(cut)] == [_strip_time(r) for r in ref]  # step for step
    again = state_tensors(resumed.model())
    assert all(np.array_equal(again[k], final[k]) for k in final)


def test_one_epoch_of_prompts_sets_the_run_length(assets, tmp_path):
    """max_steps unset, epoch unset (one pass): 12 prompts x 4 completions in batches of 8 rows
    are 6 steps (cosmos-rl's rule), resolved before the optimizer and written to config.json."""
    c = _config(assets, tmp_path, **{"train.max_steps": None})
    trainer = vlm_grpo.VLMGRPOTrainer(c)
    trainer.ckpt.close()
    trainer.rewards.close()
    assert c.train.max_steps == 6
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["train"]["max_steps"] == 6


def test_completion_masks_stop_at_end_and_visual_tokens():
    tokens = np.array([[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [5, 9, 6, 2, 0]])
    got = vlm_grpo.completion_masks(tokens, eos=(2,), banned=(9,))
    want = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(got, want)


def test_recipe_file_resolves_and_bad_reward_is_one_clear_error(assets, tmp_path):
    from wfm_jax.config.recipe import load_config

    c = load_config("configs/tiny_vlm_grpo.py")  # the schema's checks included
    assert c.train.train_policy.type == "grpo" and c.policy.family == "qwen3_vl"
    assert c.train.train_batch_per_replica % c.rollout.n_generation == 0
    bad = _config(assets, tmp_path / "bad", **{"train.train_policy.lm_grpo.rewards": ("format", "singel_choice", "test_length_mod3")})
    with pytest.raises(vlm_grpo.VLMSetupError, match="did you mean 'single_choice'"):
        vlm_grpo.VLMGRPOTrainer(bad)


@pytest.mark.slow
def test_imported_reason1_grpo_recipe_trains_one_step(assets, tmp_path):
    """cosmos-reason1's GRPO TOML (tests/recipes/cosmos_rl/reason/) as imported, on the tiny model:
    its min_filter_prefix_tokens = 1 and the annotation file read with its images elsewhere
    (policy.vlm.media_root, cosmos-reason2's custom.dataset.media_path); sizes shrunk by overrides:
    4 prompts x 4 completions rolled out 2 prompts a call (rollout.batch_size), the update in two
    micro-batches of 8 rows (train.grad_accum_steps)."""
    import shutil

    from wfm_jax.config.recipe import load_config

    model, train, _ = assets
    annotations = tmp_path / "elsewhere" / "annotations.json"
    annotations.parent.mkdir()
    shutil.copy(os.path.join(train, "annotations.json"), annotations)
    recipe = os.path.join(os.path.dirname(os.path.dirname(__file__)), "recipes", "cosmos_rl", "reason",
                          "cosmos-reason1-7b-grpo.toml")
    overrides = {"policy.model_name_or_path": model, "train.train_policy.dataset.local_dir": str(annotations),
                 "policy.vlm.media_root": train, "train.output_dir": str(tmp_path / "out"),
                 "train.max_steps": "1", "train.train_batch_per_replica": "16", "rollout.n_generation": "4",
                 "rollout.batch_size": "2", "train.grad_accum_steps": "2",
                 "train.train_policy.lm_grpo.max_response_length": "6", "policy.parallelism.fsdp": "1",
                 "policy.parallelism.data": "-1", "policy.vlm.pad_to_multiple": "64",
                 "policy.vlm.model_max_length": "512", "train.compute_dtype": "float32",
                 "train.optm_warmup_steps": "0", "train.optm_lr": "1e-3", "train.ckpt.export_safetensors": "False",
                 "train.wandb.enable": "False",
                 # the recipe's rewards plus one that varies on a random model's text: groups are kept
                 "train.train_policy.lm_grpo.rewards": "('single_choice', 'format', 'test_length_mod3')",
                 "train.train_policy.lm_grpo.reward_weights": "(1.0, 1.0, 1.0)"}
    c = load_config(recipe, list(overrides.items()))
    assert c.train.train_policy.lm_grpo.min_filter_prefix_tokens == 1
    trainer = vlm_grpo.VLMGRPOTrainer(c)
    seen, first_rollout = {}, trainer.rollout
    trainer.rollout = lambda step: seen.setdefault("roll", first_rollout(step))
    assert trainer.run() == 1
    rec = _records(c.train.output_dir)[-1]
    assert rec["train/kept_groups"] > 0 and math.isfinite(rec["train/loss"]) and rec["optimizer/grad_norm"] > 0
    roll = seen["roll"]
    assert roll["ignore"].shape == (16,) and (roll["ignore"] <= roll["completion_mask"].sum(1)).all()
    assert int(trainer.state.step) == 1  # two micro-steps, one optimizer update
    # whatever the draw gave, a row's first `ignore` completion tokens leave the update's loss mask
    forced = dict(roll, ignore=np.arange(16) % 3)
    order = list(range(16))
    mask = trainer.update_batch(forced, order)["completion_mask"][:, -roll["tokens"].shape[1]:]
    want = roll["completion_mask"].copy()
    for row, n in enumerate(forced["ignore"]):
        want[row, :n] = 0
    np.testing.assert_array_equal(mask, want)


def _dapo(assets, out, **changes):
    return _config(assets, out, **{"train.train_policy.lm_grpo.variant": "dapo",
                                   "train.train_policy.lm_grpo.rewards": ("format", "test_background_only"),
                                   "train.train_policy.lm_grpo.reward_weights": (1.0, 1.0),
                                   "train.train_policy.lm_grpo.filter_reward_metric": ("test_background_only",),
                                   **changes})


def test_dapo_refills_each_step_with_groups_whose_filter_rewards_differ(assets, tmp_path):
    """Variant "dapo" (cosmos-rl's dynamic sampling): the colour questions' filter reward is 0 on
    every completion, so their groups are dropped and more prompts are drawn until the step holds
    2 groups that differ; the reward curve counts every sampled completion. Variant "grpo" trains
    on the step's own groups, equal or not (their rows keep their loss mask)."""
    trainer = vlm_grpo.VLMGRPOTrainer(_dapo(assets, tmp_path / "dapo"))
    n, refilled = trainer.cfg.n_generation, 0
    for step in (1, 2, 3):
        roll = trainer.rollout(step)
        first = trainer.prompts(step)
        assert len(roll["rows"]) == 8 and roll["sampled_groups"] >= 2
        refilled += roll["sampled_groups"] > 2
        for g in range(2):
            record = trainer.records[roll["rows"][g * n]]
            assert record["question_type"] == "background"
            assert len(set(roll["rewards"][g].tolist())) > 1  # format is 0 throughout: the filter's own
        assert roll["sampled_rewards"].size == roll["sampled_groups"] * n
        if all(trainer.records[i]["question_type"] == "background" for i in first):
            assert roll["sampled_groups"] == 2 and sorted(set(roll["rows"])) == sorted(first)
    assert refilled  # some step drew a colour question first and had to draw again
    assert trainer.rollout(2)["rows"] == trainer.rollout(2)["rows"]  # a function of (seed, step)

    grpo = vlm_grpo.VLMGRPOTrainer(_dapo(assets, tmp_path / "grpo", **{"train.train_policy.lm_grpo.variant": "grpo"}))
    equal = 0
    for step in (1, 2, 3):
        roll = grpo.rollout(step)
        assert roll["rows"] == [i for i in grpo.prompts(step) for _ in range(n)]
        assert roll["sampled_groups"] == 2
        mask = grpo.update_batch(roll, list(range(8)))["completion_mask"][:, -roll["tokens"].shape[1]:]
        np.testing.assert_array_equal(mask, roll["completion_mask"])  # every row in the loss
        equal += sum(len(set(r.tolist())) == 1 for r in roll["rewards"])
    assert equal  # among them groups of equal rewards (advantage 0)
    for t in (trainer, grpo):
        t.ckpt.close()
        t.rewards.close()


def test_dapo_setup_and_exhausted_draws_are_one_line(assets, tmp_path):
    with pytest.raises(vlm_grpo.VLMSetupError, match="set train.train_policy.lm_grpo.filter_reward_metric"):
        vlm_grpo.VLMGRPOTrainer(_dapo(assets, tmp_path / "a", **{"train.train_policy.lm_grpo.filter_reward_metric": ()}))
    with pytest.raises(vlm_grpo.VLMSetupError, match=r"\['single_choice'\] are not among lm_grpo.rewards"):
        vlm_grpo.VLMGRPOTrainer(_dapo(assets, tmp_path / "b", **{
            "train.train_policy.lm_grpo.filter_reward_metric": ("single_choice",)}))
    # format is 0 on every completion of a random model: no group ever differs
    never = vlm_grpo.VLMGRPOTrainer(_dapo(assets, tmp_path / "c", **{
        "train.train_policy.lm_grpo.filter_reward_metric": ("format",)}))
    with pytest.raises(vlm_grpo.VLMSetupError, match="after drawing all 12 prompts, 0 of the 2 groups"):
        never.rollout(1)
    last = never.draw(1, 5, set(range(11)))  # one prompt left: topped up to a whole draw
    assert len(last) == 2 and 11 in last
    never.cfg = never.cfg.replace(max_retry_for_on_policy=2)
    with pytest.raises(vlm_grpo.VLMSetupError, match="after lm_grpo.max_retry_for_on_policy=2 draws"):
        never.rollout(1)
    never.ckpt.close()
    never.rewards.close()
