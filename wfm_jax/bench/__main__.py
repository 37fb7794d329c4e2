"""python -m wfm_jax.bench --suite cpu|gpu|cosmos_cpu|cosmos_gpu [--out results.json] [--only NAME ...]
python -m wfm_jax.bench --suite cosmos_gpu --xla-memory [--xla-devices 8] [--remat full]
python -m wfm_jax.bench --suite rl [--out rl.json] [--steps 20] [--seeds 0,1,2] [--batch N]
    [--heldout-per-prompt 16 [--heldout-split heldout_sized]]
python -m wfm_jax.bench --recipe configs/X.py [--config.a.b=v ...] [--devices N] [--batch-per-device B]

Runs each workload on wfm_jax and on the PyTorch diffusers (+ peft) stack, writes the JSON and a
markdown table beside it (results.md for results.json) and prints the table. The rl suite instead
runs the tiny NFT / GRPO / DDRL recipes under one seed and budget and tabulates reward against
samples seen (bench/rl_curves.py). --recipe times any recipe's own compiled programs, wfm_jax
only, on random weights of its shapes (bench/recipe.py): the path for a family with no torch
twin here. See docs/bench_notes.md for what every figure means.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from wfm_jax.bench.rl_heldout import SPLITS
from wfm_jax.models.layers.remat import REMAT_NAMES

WORKLOAD_NAMES = ("train_full", "train_lora", "rollout", "reward")
SUITE_NAMES = ("cpu", "gpu", "tiny", "cosmos_cpu", "cosmos_gpu", "cosmos_tiny", "rl")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m wfm_jax.bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=SUITE_NAMES, default="cpu",
                   help="gpu: real SD3.5-Medium shapes; cpu: scaled down for 2 cores; "
                        "tiny: smallest shapes, 1 repeat (the test's mode); cosmos_gpu / "
                        "cosmos_cpu / cosmos_tiny: the same for Cosmos-Predict2.5-2B at the NFT "
                        "recipe's 93 x 512^2; rl: reward curves of the tiny NFT / GRPO / DDRL "
                        "recipes")
    p.add_argument("--tiny", action="store_true", help="same as --suite tiny")
    p.add_argument("--out", default=None,
                   help="JSON path (default outputs/bench/<suite>.json); the .md goes beside it")
    p.add_argument("--only", nargs="+", choices=WORKLOAD_NAMES, metavar="NAME",
                   help=f"run only these workloads ({', '.join(WORKLOAD_NAMES)})")
    p.add_argument("--stacks", nargs="+", choices=("wfm_jax", "torch"), default=None)
    iso = p.add_mutually_exclusive_group()
    iso.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                     help="each (workload, stack) in its own process (default on gpu)")
    iso.add_argument("--no-isolate", dest="isolate", action="store_false",
                     help="everything in this process (default on cpu/tiny)")
    p.add_argument("--repeats", type=int, default=None, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps after the first call")
    p.add_argument("--train-batch", type=int, default=None)
    p.add_argument("--rollout-batch", type=int, default=None)
    p.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto",
                   help="wfm_jax attention kernel (auto: cuDNN flash attention on an NVIDIA GPU "
                        "with bf16 compute, XLA elsewhere)")
    p.add_argument("--remat", choices=REMAT_NAMES, default="everything_saveable",
                   help="wfm_jax block remat, a jax.checkpoint_policies name (or none|full|dots); "
                        "one that recomputes also turns on torch gradient checkpointing")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="wfm_jax: write a jax.profiler trace of 3 steps of each workload, taken "
                        "after the timed steps, under DIR/<workload>")
    p.add_argument("--scan-layers", choices=("on", "off"), default=None,
                   help="wfm_jax train steps: the transformer blocks as one lax.scan (on) or "
                        "unrolled (off); default: the suite's (gpu: off, as configs/sd35_sft.py "
                        "trains), else the model's own (SD3 on, Cosmos off)")
    p.add_argument("--torch-compile", action="store_true",
                   help="torch.compile the diffusers transformer (default eager)")
    p.add_argument("--steps", type=int, default=20, help="rl suite: train.max_steps of each run")
    p.add_argument("--seed", type=int, default=0, help="rl suite: train.seed of each run")
    p.add_argument("--seeds", default=None,
                   help="rl suite: comma-separated seeds, each recipe run once per seed (adds "
                        "the over-seeds PNG and samples-to-reach table); overrides --seed")
    p.add_argument("--jobs", type=int, default=1,
                   help="rl suite: runs at once (curves unchanged; wall times then not comparable)")
    p.add_argument("--batch", type=int, default=None,
                   help="rl suite: global batch of each run (default: the recipes' common one)")
    p.add_argument("--heldout-per-prompt", type=int, default=0,
                   help="rl suite: score every run's final pipeline and the base on the held-out "
                        "prompts, N images each, by the reward and the independent detector "
                        "(issue W's pass / fail; 0: off)")
    p.add_argument("--heldout-split", default=SPLITS[0], choices=SPLITS,
                   help="rl suite: the held-out prompts of that check (the recipes train on "
                        "sized prompts; heldout: the unsized ones)")
    p.add_argument("--xla-memory", action="store_true",
                   help="instead of timing: compile (not run) the suite's full and LoRA train "
                        "steps on --xla-devices simulated CPU devices (fsdp mesh, abstract "
                        "weights, train-batch rows per device) and report XLA's per-device "
                        "memory analysis")
    p.add_argument("--xla-devices", type=int, default=8, help="--xla-memory: fsdp devices")
    p.add_argument("--recipe", default=None, metavar="CONFIG",
                   help="time this recipe's own programs (SFT step; RL rollout chunk and update), "
                        "wfm_jax only, random weights; --config.a.b=v overrides it")
    p.add_argument("--devices", type=int, default=None,
                   help="--recipe: devices of the mesh (default: all of this backend's)")
    p.add_argument("--batch-per-device", type=int, default=1, help="--recipe: SFT rows per device")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    args.overrides = []
    for item in rest:  # --config.a.b=v, as wfm_jax.main takes them (with --recipe only)
        if not (args.recipe and item.startswith("--config.") and "=" in item):
            p.error(f"unrecognized argument {item!r}")
        args.overrides.append(tuple(item[len("--config."):].split("=", 1)))
    if args.tiny:
        args.suite = "tiny"
    for name in ("repeats", "train_batch", "rollout_batch", "steps", "batch", "jobs",
                 "xla_devices", "devices", "batch_per_device"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.heldout_per_prompt < 0:
        p.error(f"--heldout-per-prompt must be >= 0, got {args.heldout_per_prompt}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    isolate = args.isolate if args.isolate is not None else args.suite.endswith("gpu")
    if args.xla_memory:
        from wfm_jax.core.xla_flags import virtual_devices
        virtual_devices(args.xla_devices)  # before anything starts jax's backend
    if not isolate and args.worker is None:
        # jax and torch share the device: jax must not grab 75% of it up front
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # jax caps its pool at 75% of the device by default, preallocated or not: the SD3.5-M full
    # fine-tune at batch 8 (about 115 GiB) ran out of memory on a 141 GB H200 (2026-11-26).
    # Torch runs before jax in a shared process and empties its cache, so jax may take the rest.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    # torch's OpenMP threads spin-wait by default; on a CPU shared with other processes that
    # makes eager torch ~10x slower (measured on the 2-core CI box). Must precede `import torch`.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from wfm_jax.core import xla_flags
    xla_flags.apply()  # the GPU overlap flags training runs with (before jax's backend starts)
    from wfm_jax.bench import report, runner
    if args.worker is not None:
        return runner.worker_main(args.worker)
    out = args.out or os.path.join("outputs", "bench", f"{args.suite}.json")
    out_dir = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        print(f"bench: cannot create the output directory {out_dir}: {e.strerror}", file=sys.stderr)
        return 2
    if not os.access(out_dir, os.W_OK):
        print(f"bench: output directory {out_dir} is not writable", file=sys.stderr)
        return 2
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m wfm_jax.bench"] + given)
    if args.recipe:
        return _run_recipe(args, out if args.out else os.path.join("outputs", "bench", "recipe.json"),
                           command)
    if args.suite == "rl":
        return _run_rl(args, out, command)
    from wfm_jax.bench.suites import Options, get_suite
    suite = get_suite(args.suite, repeats=args.repeats, warmup=args.warmup,
                      train_batch=args.train_batch, rollout_batch=args.rollout_batch)
    options = Options(attention=args.attention, remat=args.remat, torch_compile=args.torch_compile,
                      profile=os.path.abspath(args.profile) if args.profile else None,
                      scan_layers=None if args.scan_layers is None else args.scan_layers == "on")
    if args.xla_memory:
        return _run_xla_memory(suite, options, args.xla_devices, out, command)
    try:
        result = runner.run_suite(suite, only=args.only, options=options, isolate=isolate,
                                  stacks=tuple(args.stacks or runner.STACKS), command=command)
    except runner.BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    md = report.write(result, out)
    print(md, end="")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.md")
    if report.busy_warning(result):
        print(f"bench: warning: {report.busy_warning(result)}", file=sys.stderr)
    failed = [f"{w}/{s}" for w, rec in result["workloads"].items()
              for s, r in rec["stacks"].items() if r["status"] != "ok"]
    if failed:
        print(f"bench: failed runs: {', '.join(failed)} (errors in the JSON)", file=sys.stderr)
        return 1
    return 0


def _run_xla_memory(suite, options, devices: int, out: str, command: str) -> int:
    from wfm_jax.bench import devices as device_info
    from wfm_jax.bench import report, xla_memory
    result = {"schema_version": report.SCHEMA_VERSION, "suite": suite.name,
              "shapes": suite.shapes(), "options": dataclasses.asdict(options),
              "command": command, "environment": device_info.environment(),
              "xla_memory": xla_memory.run(suite, options, devices)}
    md = xla_memory.markdown(result)
    report.write_json_atomic(result, out)
    report.write_text_atomic(os.path.splitext(out)[0] + ".md", md)
    print(md, end="")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.md")
    failed = [k for k, r in result["xla_memory"].items() if "error" in r]
    if failed:
        print(f"bench: failed compiles: {', '.join(failed)} (errors in the JSON)", file=sys.stderr)
        return 1
    return 0


def _run_recipe(args, out: str, command: str) -> int:
    from wfm_jax.bench import devices as device_info
    from wfm_jax.bench import recipe, report
    from wfm_jax.config.recipe import ConfigError, load_config
    from wfm_jax.core.errors import UserError
    from wfm_jax.programs import SetupError
    try:
        config = load_config(args.recipe, args.overrides)
        info = device_info.device_info()
        result = recipe.run(config, devices=args.devices, batch_per_device=args.batch_per_device,
                            repeats=args.repeats or 3, warmup=1 if args.warmup is None else args.warmup,
                            peak=device_info.peak_info(info["device_kind"], info["platform"]))
    except (ConfigError, UserError, SetupError, recipe.RecipeBenchError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    result.update({"schema_version": report.SCHEMA_VERSION, "config": args.recipe,
                   "command": command, "device_kind": info["device_kind"],
                   "environment": device_info.environment()})
    md = recipe.markdown(result)
    report.write_json_atomic(result, out)
    report.write_text_atomic(os.path.splitext(out)[0] + ".md", md)
    print(md, end="")
    print(f"wrote {out} and {os.path.splitext(out)[0]}.md")
    return 0


def _run_rl(args, out: str, command: str) -> int:
    from wfm_jax.bench import rl_curves
    try:
        seeds = None
        if args.seeds:
            try:
                seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
            except ValueError:
                raise rl_curves.RLBenchError(f"--seeds {args.seeds!r}: expected e.g. 0,1,2") from None
        result = rl_curves.run(out, steps=args.steps, seed=args.seed, batch=args.batch,
                               command=command, seeds=seeds, jobs=args.jobs,
                               heldout_per_prompt=args.heldout_per_prompt,
                               heldout_split=args.heldout_split)
    except rl_curves.RLBenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    from wfm_jax.bench import rl_compare
    print(rl_curves.markdown(result), end="")
    print(rl_compare.reach_markdown(result["samples_to_reach"], result["levels"]), end="")
    if result.get("heldout"):
        from wfm_jax.bench import rl_heldout
        print(rl_heldout.report(result["heldout"]), end="")
    print(f"wrote {out}, {os.path.splitext(out)[0]}.md and {result['png']}")
    failed = [n for n, r in result["runs"].items() if r["status"] != "ok"]
    if failed:
        print(f"bench: failed runs: {', '.join(failed)} (errors in the JSON)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
