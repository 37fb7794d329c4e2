"""Per-device memory, FLOPs and collective bytes of a recipe's training programs, from XLA's own
analysis of the compiled programs on N simulated devices, before a single weight is loaded.

    python -m wfm_jax.plan --config X.py [--config.a.b=v ...] [--devices N]
        [--device-kind h100|h200|v5p|v6e] [--batch-per-device 4] [--size 1024] [--frames 81]
        [--remat dots] [--no-scan] [--frozen-dtype float32] [--json]

Compiles the recipe's own programs (the trainers' jits with the recipe's mesh, rules,
shardings, optimizer, EMA and LoRA): SFT's train step; for NFT / GRPO / DDRL the rollout of one
chunk and the update of the whole batch (the recipe's train_batch_per_replica, mini_batch and
chunking; --batch-per-device is SFT's). Weights are abstract, of the recipe's model dir's
config.json files when it is on disk (configs only), else of the family's released pipeline
(plan/released.py). Prints per-device bytes of the params, optimizer state, EMA, the old-policy
and reference copies RL keeps, the frozen transformer buffers, the text encoders + VAE (in
--frozen-dtype, default the compute dtype), each program's temporaries and peak (RL: the
rollout's peak counts the stored batch the update will take); FLOPs (matmuls of the whole
program; XLA's per-device cost analysis alongside); the bytes its collectives move; whether the
larger peak fits the device kind's memory. CPU keeps bf16 work in fp32, so temp figures are above
a GPU's (about 30%). `--no-scan`, `--frozen-dtype float32` with
`--config.policy.parallelism.data=-1 --config.policy.parallelism.fsdp=1` give the SD3 layout
before issue 21.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from wfm_jax.plan.report import DEVICE_MEMORY


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.plan", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/sd35_sft.py")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--device-kind", choices=sorted(DEVICE_MEMORY), default="h100")
    p.add_argument("--batch-per-device", type=int, default=4)
    p.add_argument("--size", type=int, default=None,
                   help="image side in pixels (default: the recipe's inference_size)")
    p.add_argument("--frames", type=int, default=None,
                   help="video families: frames (default: the recipe's train_frames, 4k+1)")
    p.add_argument("--remat", default=None, help="a policy.remat name (default: the recipe's)")
    p.add_argument("--no-scan", action="store_true", help="unroll the blocks (no lax.scan)")
    p.add_argument("--frozen-dtype", default=None,
                   help="text encoders / VAE weights (default: train.compute_dtype)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, e.g. policy.parallelism.fsdp=1")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args, rest = p.parse_known_args(argv)
    for item in rest:  # --config.a.b=v, as wfm_jax.cli.main takes them
        if not item.startswith("--config.") or "=" not in item:
            p.error(f"unrecognized argument {item!r}")
        args.set.append(item[len("--config."):])
    return args


def virtual_devices(n: int) -> None:
    """N simulated CPU devices; must run before jax starts its backend. Set in the environment
    as well, so worker processes started after it (the bench's isolated workers) get them too."""
    flag = f"--xla_force_host_platform_device_count={n}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_platforms", "cpu")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    virtual_devices(args.devices)
    from wfm_jax.config.recipe import ConfigError
    from wfm_jax.plan.report import describe, plan
    try:
        r = plan(args)
    except ConfigError as e:  # a bad recipe or override: one line, as main says it
        raise SystemExit(f"wfm_jax.plan: {e}") from None
    print(json.dumps(r) if args.json else describe(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
