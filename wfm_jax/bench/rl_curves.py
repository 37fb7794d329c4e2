"""The rl suite: reward against samples seen for the three tiny RL recipes (NFT, Flow-GRPO,
DDRL) from the same pretrained tiny shapes pipeline, under one budget and one or more seeds.

    python -m wfm_jax.bench --suite rl [--out outputs/bench/rl.json] [--steps 20] [--seeds 0,1,2]
        [--heldout-per-prompt 16 [--heldout-split heldout_sized]]

With several seeds it also writes rl.png (mean and spread over seeds against samples seen) and
a table of the samples each recipe needs to reach fixed reward levels (bench/rl_compare.py).

Each recipe runs in a fresh `python -m wfm_jax.main` process (no jit cache or allocator shared
between them) with the same train.seed, train.max_steps and global batch
(train.train_batch_per_replica), validation and the safetensors export off; its
output_dir/metrics.jsonl gives the curve. The table's rows are step windows ending at
a few checkpoints, each cell the mean train/reward_mean over the window.

With --heldout-per-prompt N each run also exports its final pipeline, which is scored with the
base it started from on the held-out prompts (N images each) by the reward and by the
independent detector: issue W's pass / fail per recipe and seed (bench/rl_heldout.py).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

RECIPES = {"NFT": "configs/tiny_nft.py", "GRPO": "configs/tiny_grpo.py",
           "DDRL": "configs/tiny_ddrl.py"}
REWARD_KEY = "train/reward_mean"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY_WINDOW = 5  # first-k vs last-k steps


class RLBenchError(ValueError):
    """Bad rl-suite request (unknown recipe file, non-positive budget...)."""


def recipe_batches(recipes: dict) -> dict:
    """{name: train.train_batch_per_replica} as each recipe file sets it."""
    from wfm_jax.config.recipe import ConfigError, load_config
    out = {}
    for name, path in recipes.items():
        try:
            config = load_config(os.path.join(REPO_ROOT, path))
            out[name] = int(config.train.train_batch_per_replica)
        except (ConfigError, OSError) as e:
            raise RLBenchError(f"recipe {name} ({path}): {e}") from e
    return out


def common_batch(batches: dict, override: int | None) -> tuple[int, str]:
    """One global batch for every recipe and a sentence saying where it came from (the smallest
    recipe batch when they differ, so no recipe runs above its own size)."""
    listed = ", ".join(f"{n} {b}" for n, b in batches.items())
    if override is not None:
        return override, f"batch {override} given on the command line (recipes: {listed})"
    values = sorted(set(batches.values()))
    if len(values) == 1:
        return values[0], f"every recipe sets batch {values[0]}"
    return values[0], f"recipes differ ({listed}); all overridden to the smallest, {values[0]}"


def command_for(recipe: str, *, seed: int, steps: int, batch: int, output_dir: str,
                export: bool = False) -> list:
    return [sys.executable, "-m", "wfm_jax.main", "--config", recipe,
            f"--config.train.seed={seed}", f"--config.train.max_steps={steps}",
            f"--config.train.train_batch_per_replica={batch}",
            f"--config.train.output_dir={output_dir}", "--config.validation.enable=False",
            f"--config.train.ckpt.export_safetensors={export}"]


def read_metrics(path: str) -> list:
    """metrics.jsonl -> one record per step, sorted (a repeated step keeps its last line)."""
    by_step = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise RLBenchError(f"{path}: line {n} is not JSON ({e.msg})") from e
            if "step" in rec:
                by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def run_recipe(name: str, recipe: str, *, seed: int, steps: int, batch: int, workdir: str,
               timeout_s: float | None = None, export: bool = False) -> dict:
    """One recipe in a fresh process; its metrics (or the error) and wall time."""
    output_dir = os.path.join(workdir, name.lower())
    cmd = command_for(recipe, seed=seed, steps=steps, batch=batch, output_dir=output_dir,
                      export=export)
    log_path = os.path.join(workdir, f"{name.lower()}.log")
    start = time.perf_counter()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = None
    wall = time.perf_counter() - start
    rec = {"recipe": recipe, "command": " ".join(["python"] + cmd[1:]), "wall_s": wall,
           "returncode": rc, "metrics": [], "output_dir": output_dir}
    metrics_path = os.path.join(output_dir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        rec["metrics"] = [{"step": m["step"], "reward_mean": m.get(REWARD_KEY),
                           "samples_per_s": m.get("train/samples_per_s"),
                           "iteration_time_s": m.get("train/iteration_time")}
                          for m in read_metrics(metrics_path)]
    if rc == 0:
        rec["status"] = "ok"
    else:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        rec["status"] = "error"
        rec["error"] = (f"timed out after {timeout_s} s" if rc is None else f"exit {rc}") + \
            ": " + (tail.strip().splitlines() or [""])[-1]
        rec["log_tail"] = tail
    return rec


# ----------------------------------------------------------------------------- pure table

def checkpoints(steps: int) -> list:
    """Window ends: step 1 and the quarters of the budget (1, 5, 10, 15, 20 for 20 steps)."""
    return sorted({1, steps} | {max(1, round(steps * k / 4)) for k in (1, 2, 3)})


def _mean(values):
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def curve_rows(curves: dict, batch: int, ends: list) -> list:
    """[{steps: "a-b", end_step, samples_seen, <name>: mean reward over steps a..b}] for
    every window (prev end, end]; None where a run logged no reward there."""
    rows, lo = [], 1
    for end in ends:
        row = {"steps": str(end) if lo == end else f"{lo}-{end}", "end_step": end,
               "samples_seen": batch * end}
        for name, metrics in curves.items():
            row[name] = _mean(m["reward_mean"] for m in metrics if lo <= m["step"] <= end)
        rows.append(row)
        lo = end + 1
    return rows


def summary(metrics: list, k: int = SUMMARY_WINDOW) -> dict:
    """First-k and last-k mean reward (their difference: the rise), steps logged, mean
    samples/s over steps after the first (which compiles)."""
    rewards = [m["reward_mean"] for m in metrics]
    first, last = _mean(rewards[:k]), _mean(rewards[-k:])
    return {"steps_logged": len(metrics), "first_k_mean": first, "last_k_mean": last,
            "rise": last - first if first is not None and last is not None else None,
            "samples_per_s": _mean(m["samples_per_s"] for m in metrics[1:])}


def _fmt(x, spec: str = ".4e") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def markdown(result: dict) -> str:
    names = list(result["runs"])
    env, k = result["environment"], result["summary_window"]
    lines = [f"Reward against samples seen, tiny recipes, seed {result['seed']}, "
             f"{result['steps']} steps x batch {result['batch']} ({result['batch_note']}); "
             f"{env['date']}, {env['machine']}, jax {env['jax']}. Each cell: mean "
             f"`{REWARD_KEY}` (the recipes' reward) over the window's steps.", "",
             "| steps | samples seen | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for row in result["rows"]:
        lines.append(f"| {row['steps']} | {row['samples_seen']} | "
                     + " | ".join(_fmt(row[n]) for n in names) + " |")
    per = {n: r.get("summary", {}) for n, r in result["runs"].items()}
    lines.append(f"| first {k} mean | | " + " | ".join(_fmt(per[n].get("first_k_mean"))
                                                     for n in names) + " |")
    lines.append(f"| last {k} mean | | " + " | ".join(_fmt(per[n].get("last_k_mean"))
                                                    for n in names) + " |")
    lines.append("| rise (last - first) | | " + " | ".join(_fmt(per[n].get("rise"))
                                                          for n in names) + " |")
    lines.append("| wall time (s) | | " + " | ".join(_fmt(result["runs"][n]["wall_s"], ".0f")
                                                    for n in names) + " |")
    lines.append("| samples/s (steps 2+) | | " + " | ".join(_fmt(per[n].get("samples_per_s"),
                                                                 ".2f") for n in names) + " |")
    failed = [f"{n}: {r['error']}" for n, r in result["runs"].items() if r["status"] != "ok"]
    if failed:
        lines += ["", "Failed runs: " + "; ".join(failed)]
    lines += ["", f"Command: `{result['command']}`. Wall time includes process start, "
              "compilation and checkpoint saves."]
    return "\n".join(lines) + "\n"


def assemble(runs: dict, *, seed: int, steps: int, batch: int, batch_note: str, env: dict,
             command: str) -> dict:
    for rec in runs.values():
        rec["summary"] = summary(rec["metrics"])
    curves = {n: r["metrics"] for n, r in runs.items()}
    return {"suite": "rl", "seed": seed, "steps": steps, "batch": batch,
            "batch_note": batch_note, "summary_window": SUMMARY_WINDOW, "reward_key": REWARD_KEY,
            "environment": env, "command": command,
            "rows": curve_rows(curves, batch, checkpoints(steps)), "runs": runs}


# ----------------------------------------------------------------------------- driver

def environment() -> dict:
    import platform
    try:
        from importlib.metadata import version
        jax_version = version("jax")
    except Exception:
        jax_version = "n/a"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"date": time.strftime("%Y-%m-%d"), "jax": jax_version,
            "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), load average "
                       f"{load:.1f} at start",
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "python": platform.python_version()}


def run(out: str, *, steps: int, seed: int, batch: int | None = None, command: str = "",
        recipes: dict = RECIPES, timeout_s: float | None = None, keep: bool = False,
        seeds: list | None = None, jobs: int = 1, heldout_per_prompt: int = 0,
        heldout_split: str = "heldout_sized") -> dict:
    """Every recipe under every seed (`seeds`, default [seed]); the tables of the first seed
    as before, plus the over-seeds curves, the samples-to-reach table and the PNG; with
    heldout_per_prompt > 0 the held-out check of every run against its base."""
    from wfm_jax.bench import report, rl_compare
    seeds = list(seeds) if seeds else [seed]
    if steps < 1:
        raise RLBenchError(f"--steps must be >= 1, got {steps}")
    if batch is not None and batch < 1:
        raise RLBenchError(f"--batch must be >= 1, got {batch}")
    if heldout_per_prompt < 0:
        raise RLBenchError(f"--heldout-per-prompt must be >= 0, got {heldout_per_prompt}")
    from wfm_jax.bench.rl_heldout import SPLITS
    if heldout_split not in SPLITS:
        raise RLBenchError(f"--heldout-split must be one of {', '.join(SPLITS)}, got {heldout_split!r}")
    missing = [p for p in recipes.values() if not os.path.exists(os.path.join(REPO_ROOT, p))]
    if missing:
        raise RLBenchError(f"recipe file(s) not found: {', '.join(missing)}")
    base_dir = heldout_base(recipes) if heldout_per_prompt > 0 else None  # before any run
    use_batch, note = common_batch(recipe_batches(recipes), batch)
    env = environment()
    workdir = tempfile.mkdtemp(prefix="wfm_rl_bench_")
    per_seed: dict = {name: {} for name in recipes}

    def one(name: str, recipe: str, s: int):
        print(f"rl bench: {name} ({recipe}), seed {s}, {steps} steps x batch {use_batch}...",
              file=sys.stderr, flush=True)
        seed_dir = os.path.join(workdir, f"seed{s}")
        os.makedirs(seed_dir, exist_ok=True)
        rec = run_recipe(name, recipe, seed=s, steps=steps, batch=use_batch, workdir=seed_dir,
                         timeout_s=timeout_s, export=heldout_per_prompt > 0)
        print(f"rl bench: {name} seed {s} {rec['status']} in {rec['wall_s']:.0f} s",
              file=sys.stderr, flush=True)
        return name, s, rec

    todo = [(name, recipe, s) for s in seeds for name, recipe in recipes.items()]
    try:
        # jobs > 1 runs that many at once: the curves against samples seen are the same, the
        # wall times and samples/s are not comparable then (the runs share the cores)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            for name, s, rec in pool.map(lambda t: one(*t), todo):
                per_seed[name][s] = rec
        heldout = (heldout_checks(base_dir, per_seed, heldout_per_prompt, heldout_split)
                   if base_dir is not None else None)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    runs = {name: per_seed[name][seeds[0]] for name in recipes}
    result = assemble(runs, seed=seeds[0], steps=steps, batch=use_batch, batch_note=note,
                      env=env, command=command)
    curves = rl_compare.seed_curves(
        {n: {s: r["metrics"] for s, r in by.items()} for n, by in per_seed.items()}, use_batch)
    levels = rl_compare.default_levels(curves)
    reach = rl_compare.samples_to_reach(curves, levels)
    result.update(seeds=seeds, jobs=jobs, seed_curves=curves, levels=levels, samples_to_reach=reach,
                  heldout=heldout,
                  seed_runs={n: {str(s): {k: v for k, v in r.items() if k != "log_tail"}
                                 for s, r in by.items()} for n, by in per_seed.items()})
    png = rl_compare.plot_png(curves, os.path.splitext(out)[0] + ".png",
                              f"{REWARD_KEY}: mean +- std over seeds {seeds}, batch {use_batch}")
    result["png"] = png
    md = markdown(result) + "\n" + rl_compare.reach_markdown(reach, levels)
    if heldout:
        from wfm_jax.bench import rl_heldout
        md += "\n" + rl_heldout.report(heldout)
    report.write_json_atomic(result, out)
    report.write_text_atomic(os.path.splitext(out)[0] + ".md", md)
    return result


def heldout_base(recipes: dict) -> str:
    """The pipeline every recipe starts from (the held-out check compares each run with it)."""
    from wfm_jax.config.recipe import load_config
    bases = {os.path.abspath(os.path.join(REPO_ROOT, str(load_config(
        os.path.join(REPO_ROOT, path)).policy.model_name_or_path))) for path in recipes.values()}
    if len(bases) != 1:
        raise RLBenchError(f"the held-out check needs one base for every recipe, got {sorted(bases)}")
    return bases.pop()


def heldout_checks(base_dir: str, per_seed: dict, per_prompt: int,
                   split: str = "heldout_sized") -> dict:
    """{"base": the base's held-out scores, "checks": {recipe: {seed: final pipeline's scores
    and verdict, or the error}}}."""
    from wfm_jax.bench import rl_heldout
    print(f"rl bench: held-out check of the base {base_dir}...", file=sys.stderr, flush=True)
    try:
        base = rl_heldout.evaluate(base_dir, per_prompt, cwd=REPO_ROOT, split=split)
    except RuntimeError as e:  # the runs' curves are still worth keeping
        return {"per_prompt": per_prompt, "base_dir": base_dir, "error": str(e)}
    checks: dict = {}
    for name, by_seed in per_seed.items():
        for s, rec in by_seed.items():
            final = rl_heldout.final_export(rec["output_dir"]) if rec["status"] == "ok" else None
            if final is None:
                checks.setdefault(name, {})[s] = {"error": rec.get("error", "no exported pipeline")}
                continue
            try:
                after = rl_heldout.evaluate(final, per_prompt, cwd=REPO_ROOT, split=split)
            except RuntimeError as e:
                checks.setdefault(name, {})[s] = {"error": str(e)}
                continue
            checks.setdefault(name, {})[s] = {"after": after, **rl_heldout.verdict(base, after)}
    return {"per_prompt": per_prompt, "base_dir": base_dir, "base": base, "checks": checks}
