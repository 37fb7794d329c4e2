"""The rl suite's held-out check (issue W's acceptance, as a command): each run's final pipeline
and the base it started from, scored on the shapes world's held-out prompts by the recipes'
reward (`shapes_alignment`) and by the independent detector (worlds/shapes/detector.py).

A run passes when its held-out reward rises by at least MIN_RISE and no attribute the detector
reads on the split (colour, shape, count, background; size on the sized splits) falls by more
than MAX_FALL: RL that raises the reward by breaking the picture is not learning. The recipes
train on prompts that ask a size (`shapes_train_sized.txt`), so the check's default split is
`heldout_sized`; `heldout` is the unsized one the base's own targets are read on.
"""
from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys

MIN_RISE = 0.05
MAX_FALL = 0.05
ATTRIBUTES = ("colour", "shape", "count", "background", "size")  # those the split has are read
SPLITS = ("heldout_sized", "heldout")


def final_export(output_dir: str) -> str | None:
    """The run's last exported diffusers pipeline (output_dir/safetensors/step_N), or None."""
    steps = glob.glob(os.path.join(output_dir, "safetensors", "step_*"))
    return max(steps, key=lambda p: int(p.rsplit("_", 1)[1])) if steps else None


def evaluate(directory: str, per_prompt: int, cwd: str | None = None,
             split: str = "heldout_sized") -> dict:
    """{"reward": mean shapes_alignment, "n": images, "split", "detected": {attribute: accuracy}}
    of the pipeline at `directory` on the held-out prompts of `split` (10-step Euler, no CFG,
    seed 0), by `python -m wfm_jax.tiny_eval` in its own process, as the runs themselves are."""
    cmd = [sys.executable, "-m", "wfm_jax.tiny_eval", directory, "--split", split,
           "--per-prompt", str(per_prompt)]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"tiny_eval of {directory} failed (exit {proc.returncode}): {tail}")
    r = json.loads(lines[-1])
    return {"reward": r["shapes_alignment"], "n": r["n"], "split": split,
            "detected": {k: r["detected"][k] for k in (*ATTRIBUTES, "all") if k in r["detected"]}}


def read_attributes(scores: dict) -> tuple:
    """The attributes of ATTRIBUTES the scores hold (size only on a sized split)."""
    return tuple(k for k in ATTRIBUTES if k in scores["detected"])


def verdict(before: dict, after: dict) -> dict:
    """Rise of the held-out reward, change of each detected attribute, and whether it passes."""
    rise = after["reward"] - before["reward"]
    change = {k: after["detected"][k] - before["detected"][k] for k in read_attributes(before)}
    worst = min(change.values())
    return {"rise": rise, "change": change, "worst_change": worst,
            "passes": rise >= MIN_RISE and worst >= -MAX_FALL}


def _f(x, spec=".3f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def markdown(base: dict, checks: dict) -> str:
    """checks: {recipe: {seed: {"after": evaluate(...), **verdict(...)} or {"error": ...}}}."""
    det, names = base["detected"], read_attributes(base)
    lines = [f"Held-out prompts ({base.get('split', 'heldout')}), {base['n']} images per "
             f"pipeline: `shapes_alignment` and the detector's {' / '.join(names)}. Base: reward "
             f"{_f(base['reward'])}, detector " + " / ".join(_f(det[k], ".2f") for k in names)
             + f". Passes: rise >= {MIN_RISE} and no attribute down by more than {MAX_FALL}.", "",
             f"| recipe | seed | held-out reward (rise) | {' / '.join(names)} (change) | passes |",
             "|---|---|---|---|---|"]
    for name, by_seed in checks.items():
        for seed, c in by_seed.items():
            if "error" in c:
                lines.append(f"| {name} | {seed} | n/a | n/a | no: {c['error']} |")
                continue
            after = c["after"]["detected"]
            attrs = " / ".join(f"{after[k]:.2f} ({c['change'][k]:+.2f})" for k in names)
            lines.append(f"| {name} | {seed} | {_f(c['after']['reward'])} ({c['rise']:+.3f}) | "
                         f"{attrs} | {'yes' if c['passes'] else 'no'} |")
    return "\n".join(lines) + "\n"


def report(heldout: dict) -> str:
    """The held-out section of the rl suite's report (heldout: rl_curves.heldout_checks)."""
    if "error" in heldout:
        return f"Held-out check not run: the base {heldout['base_dir']}: {heldout['error']}\n"
    return markdown(heldout["base"], heldout["checks"])
