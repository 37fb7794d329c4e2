"""A complete tiny StableDiffusion3Pipeline directory with random weights, built offline in seconds.

    python -m wfm_jax.tiny DIR [--seed S] [--overwrite]
    python -m wfm_jax.tiny --family wan DIR   (a tiny WanPipeline instead: wfm_jax.families.wan.tiny)
    python -m wfm_jax.tiny --family cosmos DIR   (Cosmos2_5_PredictBasePipeline: tiny_cosmos)
    python -m wfm_jax.tiny --family sana|sana_video DIR   (SanaPipeline / SanaVideoPipeline:
                                                           wfm_jax.families.sana.tiny)
    python -m wfm_jax.tiny --pretrained DIR   (trained on the shapes world: tiny_pretrain.py)

Tests and the embedded recipe defaults use it in place of a downloaded model. It needs no torch:
tokenizers are built from a byte-level vocab and saved by transformers, configs are written as
JSON (the same files diffusers/transformers `save_pretrained` write), and every weight is drawn
with numpy in the shape the wfm_jax model and its converter table give, then saved as
safetensors in the diffusers/transformers key layout. All of it goes into a temporary sibling
directory renamed into place, so DIR is either complete or untouched.
"""
from __future__ import annotations

import argparse
import json
import sys

from wfm_jax.families import FAMILIES
from wfm_jax.families.tiny import build_tiny_pipeline
from wfm_jax.train.pretrain import BuildStopped, PretrainSettings, ensure_pretrained
from wfm_jax.train.pretrain_eval import SPLIT_SCENES, score_directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wfm_jax.tiny",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("directory", nargs="?", help="output pipeline directory (absent or empty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    parser.add_argument("--family", choices=FAMILIES.names(), default="sd3",
                        help="which pipeline: sd3 (StableDiffusion3Pipeline, the default), wan "
                             "(WanPipeline), cosmos (Cosmos2_5_PredictBasePipeline), sana "
                             "(SanaPipeline) or sana_video (SanaVideoPipeline)")
    parser.add_argument("--pretrained", metavar="DIR",
                        help="build (or reuse the cached) tiny pipeline SFT-trained on the shapes "
                             "world at DIR instead (about 6 minutes on 2 idle CPU cores, once)")
    args = parser.parse_args(argv)
    if args.pretrained:
        if args.family != "sd3":
            parser.error("--pretrained builds the SD3 shapes-world pipeline only")
        from wfm_jax.io.lock import LockHeldError
        from wfm_jax.train.preempt import sigterm_stops_after_step
        try:
            with sigterm_stops_after_step():  # SIGTERM: the build's work is kept for a rerun
                print(ensure_pretrained(args.pretrained, PretrainSettings(seed=args.seed)))
        except LockHeldError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except BuildStopped as e:
            print(f"error: {e}", file=sys.stderr)
            return 143
        return 0
    if not args.directory:
        parser.error("give DIR (a random pipeline) or --pretrained DIR")
    try:
        path = build_tiny_pipeline(args.directory, seed=args.seed, overwrite=args.overwrite,
                                   family=args.family)
    except (ValueError, OSError) as e:  # FileExistsError and PermissionError are OSErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


def eval_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wfm_jax.tiny_eval",
                                description="Scores a tiny SD3 pipeline on the shapes world's prompts "
                                            "(shapes_alignment).")
    p.add_argument("directory")
    p.add_argument("--split", default="heldout", choices=sorted(SPLIT_SCENES))
    p.add_argument("--per-prompt", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(json.dumps(score_directory(args.directory, args.split, per_prompt=args.per_prompt,
                                     steps=args.steps, seed=args.seed)))
    return 0
