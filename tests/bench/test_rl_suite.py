"""wfm_jax.bench's rl suite: the reward-curve table from metrics files, the recipes' common
batch and overrides, bad input, the over-seeds curves with the samples-to-reach table and PNG,
and the held-out check's verdict and report (issue W's pass / fail)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from wfm_jax.bench.__main__ import main


def _write_metrics(path, rewards):
    """A metrics.jsonl like the RL trainer's (one object per step, extra keys, a blank line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "train/reward_mean": r, "train/loss": 1.0,
                         "train/samples_per_s": 2.0 * step}) for step, r in enumerate(rewards, 1)]
    path.write_text("\n".join(lines) + "\n\n")


def test_rl_curve_table_from_metrics_files(tmp_path):
    from wfm_jax.bench import rl_curves
    rng = np.random.default_rng(0)
    steps, batch = 12, 6
    rewards = {n: rng.normal(size=steps).tolist() for n in ("NFT", "GRPO", "DDRL")}
    rewards["DDRL"] = rewards["DDRL"][:7]  # a run that stopped early
    stale = tmp_path / "NFT" / "metrics.jsonl"
    _write_metrics(stale, [99.0] * 3)
    with open(stale, "a") as f:  # then the real curve re-logged over steps 1..3
        for step, r in enumerate(rewards["NFT"], 1):
            f.write(json.dumps({"step": step, "train/reward_mean": r,
                                "train/samples_per_s": 2.0 * step}) + "\n")
    for n in ("GRPO", "DDRL"):
        _write_metrics(tmp_path / n / "metrics.jsonl", rewards[n])
    runs = {}
    for n in rewards:
        metrics = rl_curves.read_metrics(str(tmp_path / n / "metrics.jsonl"))
        assert [m["step"] for m in metrics] == list(range(1, len(rewards[n]) + 1))
        runs[n] = {"status": "ok", "wall_s": 1.0, "metrics": [
            {"step": m["step"], "reward_mean": m["train/reward_mean"],
             "samples_per_s": m["train/samples_per_s"]} for m in metrics]}
    runs["DDRL"].update(status="error", error="exit 1: boom")
    env = {"date": "d", "machine": "m", "jax": "j"}
    result = rl_curves.assemble(runs, seed=3, steps=steps, batch=batch, batch_note="note",
                                env=env, command="cmd")
    ends = rl_curves.checkpoints(steps)
    assert ends[0] == 1 and ends[-1] == steps and ends == sorted(set(ends))
    lo = 1
    for row, end in zip(result["rows"], ends, strict=True):
        assert row["samples_seen"] == batch * end
        for n, r in rewards.items():
            window = r[lo - 1:end]
            if window:
                np.testing.assert_allclose(row[n], np.mean(window), rtol=1e-12)
            else:
                assert row[n] is None
        lo = end + 1
    for n, r in rewards.items():
        s = result["runs"][n]["summary"]
        np.testing.assert_allclose(s["first_k_mean"], np.mean(r[:5]), rtol=1e-12)
        np.testing.assert_allclose(s["last_k_mean"], np.mean(r[-5:]), rtol=1e-12)
        np.testing.assert_allclose(s["samples_per_s"], np.mean(2.0 * np.arange(2, len(r) + 1)))
    md = rl_curves.markdown(result)
    header = next(line for line in md.splitlines() if line.startswith("| steps"))
    assert header.split("|")[3:6] == [" NFT ", " GRPO ", " DDRL "]
    assert "n/a" in md and "DDRL: exit 1: boom" in md
    json.dumps(result)  # the JSON document must serialise


def test_rl_common_batch_and_overrides_reach_every_recipe():
    from wfm_jax.bench import rl_curves
    from wfm_jax.config.recipe import load_config, parse_overrides
    assert rl_curves.common_batch({"A": 8, "B": 8}, None)[0] == 8
    batch, note = rl_curves.common_batch({"A": 16, "B": 8}, None)
    assert batch == 8 and "differ" in note
    assert rl_curves.common_batch({"A": 16, "B": 8}, 4)[0] == 4
    batches = rl_curves.recipe_batches(rl_curves.RECIPES)
    assert set(batches) == set(rl_curves.RECIPES)
    for name, recipe in rl_curves.RECIPES.items():
        cmd = rl_curves.command_for(recipe, seed=7, steps=3, batch=4, output_dir="/tmp/x")
        path, overrides = parse_overrides(cmd[cmd.index("--config"):])
        c = load_config(os.path.join(rl_curves.REPO_ROOT, path), overrides)
        assert (c.train.seed, c.train.max_steps, c.train.train_batch_per_replica) == (7, 3, 4)
        assert not c.validation.enable and c.train.output_dir == "/tmp/x", name


def test_rl_suite_bad_input(tmp_path, capsys):
    from wfm_jax.bench import rl_curves
    with pytest.raises(SystemExit) as e:
        main(["--suite", "rl", "--steps", "0", "--out", str(tmp_path / "rl.json")])
    assert e.value.code == 2
    with pytest.raises(rl_curves.RLBenchError, match="nope.py"):
        rl_curves.run(str(tmp_path / "rl.json"), steps=2, seed=0,
                      recipes={"X": "configs/nope.py"})
    assert not (tmp_path / "rl.json").exists()


def test_rl_seed_curves_reach_table_and_png(tmp_path):
    from PIL import Image

    from wfm_jax.bench import rl_compare
    batch = 4
    per_seed = {"NFT": {0: [{"step": s, "reward_mean": 0.5 + 0.01 * s} for s in range(1, 11)],
                        1: [{"step": s, "reward_mean": 0.5 + 0.03 * s} for s in range(1, 11)]},
                "GRPO": {0: [{"step": s, "reward_mean": 0.52} for s in range(1, 11)],
                         1: [{"step": s, "reward_mean": 0.52} for s in range(1, 8)]}}  # stopped
    curves = rl_compare.seed_curves(per_seed, batch)
    assert curves["NFT"]["samples"] == [4 * s for s in range(1, 11)]
    np.testing.assert_allclose(curves["NFT"]["mean"], [0.5 + 0.02 * s for s in range(1, 11)])
    np.testing.assert_allclose(curves["NFT"]["std"], [0.01 * s for s in range(1, 11)])
    assert curves["GRPO"]["steps"] == list(range(1, 8))  # only steps every seed logged
    levels = rl_compare.default_levels(curves, rises=(0.05, 0.5))
    assert levels == [round((0.52 + 0.52) / 2 + 0.05, 4), round(0.52 + 0.5, 4)]
    reach = rl_compare.samples_to_reach(curves, levels)
    # NFT's 3-step running mean 0.5 + 0.02 (s - 1) reaches 0.57 at s = 4.5 -> step 5
    assert reach["NFT"][str(levels[0])] == 5 * batch and reach["NFT"][str(levels[1])] is None
    assert reach["GRPO"][str(levels[0])] is None
    assert "| 0.570 | 20 | - |" in rl_compare.reach_markdown(reach, levels)
    png = rl_compare.plot_png(curves, str(tmp_path / "rl.png"), "t")
    assert Image.open(png).size == (720, 440)


def _scores(reward, colour, shape, count):
    return {"reward": reward, "n": 192,
            "detected": {"colour": colour, "shape": shape, "count": count, "all": 0.1}}


def test_rl_heldout_verdict_needs_a_rise_and_no_broken_attribute(tmp_path):
    from wfm_jax.bench import rl_heldout
    base = _scores(0.60, 0.78, 0.33, 0.44)
    ok = rl_heldout.verdict(base, _scores(0.66, 0.90, 0.40, 0.40))
    assert ok["passes"] and ok["rise"] == pytest.approx(0.06)
    assert ok["change"]["count"] == pytest.approx(-0.04) and ok["worst_change"] == pytest.approx(-0.04)
    # the reward up by breaking the count (the NFT run before the speck fix): not learning
    hacked = rl_heldout.verdict(base, _scores(0.69, 0.93, 0.45, 0.36))
    assert not hacked["passes"] and hacked["worst_change"] == pytest.approx(-0.08)
    assert not rl_heldout.verdict(base, _scores(0.64, 0.80, 0.33, 0.44))["passes"]  # rise 0.04
    md = rl_heldout.markdown(base, {"NFT": {0: {"after": _scores(0.66, 0.90, 0.40, 0.40), **ok}},
                                    "DDRL": {1: {"error": "exit 1: boom"}}})
    assert "| NFT | 0 | 0.660 (+0.060) | 0.90 (+0.12) / 0.40 (+0.07) / 0.40 (-0.04) | yes |" in md
    assert "| DDRL | 1 | n/a | n/a | no: exit 1: boom |" in md
    assert rl_heldout.report({"base_dir": "/b", "error": "boom"}).startswith("Held-out check not run")
    # the last export by step number, not by name
    for step in (5, 20, 100):
        (tmp_path / "safetensors" / f"step_{step}").mkdir(parents=True)
    assert rl_heldout.final_export(str(tmp_path)).endswith("step_100")
    assert rl_heldout.final_export(str(tmp_path / "none")) is None


def test_rl_heldout_reads_size_and_background_where_the_split_has_them(tmp_path):
    from wfm_jax.bench import rl_curves, rl_heldout
    base, after = _scores(0.64, 0.49, 0.39, 0.61), _scores(0.70, 0.52, 0.40, 0.66)
    base["detected"].update(background=0.93, size=0.63)
    after["detected"].update(background=0.99, size=0.55)  # the size word unlearnt: -0.08
    v = rl_heldout.verdict(base, after)
    assert set(v["change"]) == {"colour", "shape", "count", "background", "size"}
    assert not v["passes"] and v["worst_change"] == pytest.approx(-0.08)
    md = rl_heldout.markdown({**base, "split": "heldout_sized"}, {"GRPO": {0: {"after": after, **v}}})
    assert "(heldout_sized)" in md and "colour / shape / count / background / size (change)" in md
    assert "0.55 (-0.08) | no |" in md
    with pytest.raises(rl_curves.RLBenchError, match="--heldout-split must be one of"):
        rl_curves.run(str(tmp_path / "rl.json"), steps=2, seed=0, heldout_per_prompt=4,
                      heldout_split="train")
    assert not (tmp_path / "rl.json").exists()


def test_rl_heldout_evaluate_fails_in_one_line_on_a_missing_pipeline(tmp_path):
    from wfm_jax.bench import rl_heldout
    with pytest.raises(RuntimeError, match="tiny_eval of .*nothing failed"):
        rl_heldout.evaluate(str(tmp_path / "nothing"), 1)


def test_rl_heldout_base_is_the_recipes_one_and_must_be_shared(tmp_path):
    from wfm_jax.bench import rl_curves
    assert rl_curves.heldout_base(rl_curves.RECIPES).endswith(os.path.join("outputs", "tiny_sd3_shapes"))
    with pytest.raises(rl_curves.RLBenchError, match="one base for every recipe"):
        rl_curves.run(str(tmp_path / "rl.json"), steps=2, seed=0, heldout_per_prompt=4,
                      recipes={"NFT": "configs/tiny_nft.py", "SFT": "configs/tiny_sft.py"})
    assert not (tmp_path / "rl.json").exists()
