"""Per-device memory, FLOPs and collective bytes of a recipe's training programs, from XLA's own
analysis of the compiled programs on N simulated devices, before a single weight is loaded.

    python -m wfm_jax.plan --config X.py [--config.a.b=v ...] [--devices N]
        [--device-kind h100|h200|v5p|v6e] [--batch-per-device 4] [--size 1024] [--frames 81]
        [--remat dots] [--no-scan] [--frozen-dtype float32] [--hbm-gib G] [--json]
    python -m wfm_jax.plan --config X.py --topology v5p:2x2x1 [--num-slices N] [...]
        [--no-validation] [--hlo-dir DIR]   (tuning: the training programs only; their HLO kept)
    python -m wfm_jax.plan --config configs/sd35_sft.py --topology v5p:2x2x1 --layers 2
        (DiT families: compile K and 2K transformer blocks, scale to the depth: plan/layers.py)
    python -m wfm_jax.plan --config configs/reason2_8b_sft.py [--seq-len 4096] [--size 512]
        [--vision-blocks 3]     (VLM families: the SFT step, plan/vlm.py)

--topology compiles for a TPU topology with libtpu's compiler, no TPU needed (plan/topology.py;
docs/sharding_and_memory.md): per program compiled or the compiler's error, bytes per device
against the chip's HBM, the cost model's step time and MFU (estimates: its loop-once seconds x
the loops' trip counts read off the compiled HLO, plan/hlo_cost.py), the attention kernel, and
where the time goes (per kind of instruction and per source line: plan/hlo_breakdown.py).

Compiles the recipe's own programs (the trainers' jits with the recipe's mesh, rules,
shardings, optimizer, EMA and LoRA): SFT's train step; for NFT / GRPO / DDRL the rollout of one
chunk and the update of the whole batch (the recipe's train_batch_per_replica, mini_batch and
chunking; --batch-per-device is SFT's). Weights are abstract, of the recipe's model dir's
config.json files when it is on disk (configs only), else of the family's released pipeline
(programs/released.py). Prints per-device bytes of the params, optimizer state, EMA, the old-policy
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

import contextlib
import json
import sys

from wfm_jax.core.xla_flags import virtual_devices
from wfm_jax.plan.args import parse_args

__all__ = ["main", "parse_args", "virtual_devices"]


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.topology:  # the topology's compile-only devices, on the CPU backend
        from wfm_jax.plan.topology import prepare_environment
        prepare_environment()
    else:
        virtual_devices(args.devices)
    from wfm_jax.config.recipe import ConfigError
    from wfm_jax.plan.report import describe, plan
    try:
        # --json: stdout is the JSON alone; what the planner says on the way (a tiny asset built
        # on first use) goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            r = plan(args)
    except ConfigError as e:  # a bad recipe or override: one line, as main says it
        raise SystemExit(f"wfm_jax.plan: {e}") from None
    print(json.dumps(r) if args.json else describe(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
