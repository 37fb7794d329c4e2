"""The planner's command-line arguments and the device kinds it knows (shared by the command and
check_fits, which plans a run on its own devices)."""
from __future__ import annotations

import argparse

GiB = 2 ** 30

# usable memory per device (bytes): H100 SXM 80 GB, H200 141 GB, TPU v5p 95 GiB, v6e 32 GiB
DEVICE_MEMORY = {"h100": 80e9, "h200": 141e9, "v5p": 95 * GiB, "v6e": 32 * GiB}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.plan",
                                description="Per-device memory, FLOPs and collective bytes of a "
                                            "recipe's training programs, before any weight is read.")
    p.add_argument("--config", default="configs/sd35_sft.py")
    p.add_argument("--devices", type=int, default=None,
                   help="N virtual CPU devices (default: the recipe's plan.target when it names "
                        "GPUs, else 8)")
    p.add_argument("--device-kind", choices=sorted(DEVICE_MEMORY), default=None,
                   help="whose memory the verdict uses (default: plan.target's GPU, else h100)")
    p.add_argument("--batch-per-device", type=int, default=None,
                   help="SFT rows per device (default: planned at the recipe's plan.target, the "
                        "recipe's train_batch_per_replica over the batch shards; else 4)")
    p.add_argument("--size", type=int, default=None,
                   help="image side in pixels (default: the recipe's inference_size; VLM: one image "
                        "per row, 512)")
    p.add_argument("--frames", type=int, default=None,
                   help="video families: frames (default: the recipe's train_frames, 4k+1)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="VLM families: SFT, tokens per row (default: the recipe's "
                        "policy.vlm.model_max_length); GRPO, tokens per prompt (default: "
                        "model_max_length - lm_grpo.max_response_length)")
    p.add_argument("--vision-blocks", type=int, default=None, metavar="K",
                   help="VLM families: compile K and 2K vision blocks and scale to the whole tower "
                        "(a faster compile)")
    p.add_argument("--layers", type=int, default=None, metavar="K",
                   help="DiT families (SD3/3.5, Wan2.1, Cosmos-Predict2.5, SANA, SANA-Video): "
                        "compile each program with K and 2K transformer blocks and scale bytes, "
                        "FLOPs and the estimates linearly to the model's depth (the resident state "
                        "is the whole model's). K >= 1, 2K <= the depth (2K = the depth: the model "
                        "itself). Default on a TPU topology: 2 for a DiT of 8 blocks or more "
                        "(--full-depth: the model itself). Blocks of each kind in proportion "
                        "(SD3.5's dual-attention, plain "
                        "and last: the report's layer_scaling). Unrolled blocks save the most time; "
                        "a scanned step compiles faster cut too (Wan2.1's update: 49 + 55 s at 2 "
                        "and 4 blocks, 149 s at 30); with scans, a K whose cut models scan too "
                        "(layer_scaling.scan_kept_from_k) keeps the figures near a full compile's "
                        "(docs/sharding_and_memory.md)")
    p.add_argument("--full-depth", action="store_true",
                   help="compile the model at its own depth, where a TPU topology would cut a deep "
                        "DiT to --layers 2 (slower: 15-20 minutes for SD3.5-M or Wan2.1 on 2 "
                        "cores; exact figures, where scaled peaks measured 5.5%% under to 13.5%% "
                        "over)")
    p.add_argument("--split-decode", action="store_true",
                   help="compile the model itself, but the sampler and the RL rollout as two "
                        "programs each: the part up to the VAE decode, and the decode, compiled "
                        "once for both and joined (as --layers does): exact figures for the "
                        "model itself without compiling the decode twice")
    p.add_argument("--remat", default=None, help="a policy.remat name (default: the recipe's)")
    p.add_argument("--no-scan", action="store_true", help="unroll the blocks (no lax.scan)")
    p.add_argument("--frozen-dtype", default=None,
                   help="text encoders / VAE weights (default: train.compute_dtype)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, e.g. policy.parallelism.fsdp=1")
    p.add_argument("--topology", default=None, metavar="NAME",
                   help="compile for this TPU topology with libtpu, no TPU needed (e.g. v5p:2x2x1, "
                        "v5e:2x2, v4:2x2x1, v6e:2x2): its devices replace --devices/--device-kind")
    p.add_argument("--num-slices", type=int, default=1,
                   help="with --topology: that many slices of it (multi-slice)")
    p.add_argument("--hbm-gib", type=float, default=None,
                   help="per-device memory the fit verdict uses, GiB (default: the device's)")
    p.add_argument("--no-validation", action="store_true",
                   help="with --topology: skip the validation program (sample / evaluate), e.g. "
                        "while tuning the training step")
    p.add_argument("--hlo-dir", default=None, metavar="DIR",
                   help="with --topology: write each compiled program's optimized HLO there")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where compiled programs' figures are kept and reused (default: "
                        "$WFM_JAX_PLAN_CACHE, else ~/.cache/wfm_jax/plan; plan/stats_cache.py)")
    p.add_argument("--no-cache", action="store_true",
                   help="compile every program, neither reading nor writing the cache")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args, rest = p.parse_known_args(argv)
    for item in rest:  # --config.a.b=v, as wfm_jax.cli.main takes them
        if not item.startswith("--config.") or "=" not in item:
            p.error(f"unrecognized argument {item!r}")
        args.set.append(item[len("--config."):])
    if args.full_depth and args.layers is not None:
        p.error("--full-depth compiles the model itself; --layers K compiles K and 2K blocks")
    if args.split_decode and args.layers is not None:
        p.error("--split-decode is for the model at its own depth; --layers K already compiles "
                "the decode once")
    return resolve_target(args)


def resolve_target(args):
    """Where to plan: --topology / --devices as given; with neither, the recipe's plan.target
    (a TPU topology -> --topology, GPUs -> --devices and --device-kind); else 8 H100s.
    args.target: what was planned for ("v5p:2x2x1", "h100:8"), args.target_source: "command
    line", "recipe plan.target" (also when the command line names that target) or "default";
    args.recipe_batch: SFT's rows per device are the recipe's (planned at its target with no
    --batch-per-device)."""
    from wfm_jax.config.recipe import ConfigError, load_config
    from wfm_jax.config.targets import parse_target
    explicit = args.topology is not None or args.devices is not None
    target = None
    # an explicit target with explicit rows needs nothing from the recipe (the trainer's own
    # memory check plans that way, with no --config)
    if not explicit or args.batch_per_device is None:
        try:
            config = load_config(args.config, [tuple(kv.split("=", 1)) for kv in args.set])
            target = parse_target(config.plan.target) if str(config.plan.target) else None
        except ConfigError as e:
            raise SystemExit(f"wfm_jax.plan: {e}") from None
    args.target_source = "command line"
    if target is not None and _names_the_target(args, target):
        # the recipe's own target given explicitly plans the same program as leaving it out
        args.target_source = "recipe plan.target"
    if not explicit:
        if target is None:
            args.target_source = "default"
        elif target[0] == "tpu":
            args.topology, args.target_source = target[1], "recipe plan.target"
        else:
            args.devices, args.target_source = target[2], "recipe plan.target"
            args.device_kind = args.device_kind or target[1]
    args.devices = 8 if args.devices is None else args.devices
    args.device_kind = args.device_kind or "h100"
    args.target = (f"{args.topology}" + (f" x {args.num_slices} slices" if args.num_slices > 1 else "")
                   if args.topology else f"{args.device_kind}:{args.devices}")
    args.recipe_batch = args.batch_per_device is None and args.target_source == "recipe plan.target"
    if args.batch_per_device is None and not args.recipe_batch:
        args.batch_per_device = 4
    return args


def _names_the_target(args, target: tuple[str, str, int]) -> bool:
    """Whether --topology / --devices (and --device-kind) name the recipe's plan.target."""
    kind, name, count = target
    if kind == "tpu":
        return (str(args.topology).lower() == name and args.devices is None
                and args.num_slices == 1)
    return (args.topology is None and args.devices == count
            and (args.device_kind or "h100") == name)


def recipe_rows_per_device(args, config, mesh) -> int:
    """SFT's rows per device: --batch-per-device, or (args.recipe_batch) the recipe's global
    batch over the devices the batch is split over (one line when it does not divide)."""
    if not getattr(args, "recipe_batch", False):
        return int(args.batch_per_device)
    shards = int(mesh.devices.size) // int(mesh.shape["context"])
    batch = int(config.train.train_batch_per_replica)
    if batch % shards:
        raise SystemExit(f"wfm_jax.plan: train_batch_per_replica={batch} does not split over the "
                         f"{shards} batch shards of {args.target}; give --batch-per-device")
    return batch // shards


def target_fields(args, config) -> dict:
    """The report's "target" (what was planned for), "target_source" and the recipe's own
    "recipe_target" (plan.target, "" when it names none)."""
    return {"target": getattr(args, "target", None),
            "target_source": getattr(args, "target_source", None),
            "recipe_target": str(config.plan.target)}
