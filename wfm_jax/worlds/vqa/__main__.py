"""python -m wfm_jax.worlds.vqa DIR --count N --split train|heldout [--seed S] [--types a,b]
[--options shuffled|fixed] [--target fixed|answer|look] [--fixed-think-fraction F]"""
from __future__ import annotations

import argparse
import sys

from wfm_jax.worlds.vqa.dataset import SPLITS, build_vqa_dataset
from wfm_jax.worlds.vqa.scenes import OPTION_ORDERS, QUESTION_TYPES, TARGET_STYLES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wfm_jax.worlds.vqa",
                                description="Write the tiny VQA world as LLaVA JSON conversations + PNGs.")
    p.add_argument("directory")
    p.add_argument("--count", type=int, default=256)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--types", default=",".join(QUESTION_TYPES), help="comma-separated question types")
    p.add_argument("--options", default="shuffled", choices=OPTION_ORDERS,
                   help="the options' order: shuffled per question, or one fixed order per question type")
    p.add_argument("--target", default="fixed", choices=TARGET_STYLES,
                   help="the answers' think text: fixed, the answer's text, or what to look at and the answer's text")
    p.add_argument("--fixed-think-fraction", type=float, default=0.0,
                   help="the share of answers that think the fixed sentence instead of --target's (mixed reasoning)")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    try:
        print(build_vqa_dataset(args.directory, args.count, args.split, args.seed,
                                tuple(t for t in args.types.split(",") if t), args.overwrite,
                                options=args.options, target=args.target,
                                fixed_think_fraction=args.fixed_think_fraction))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
