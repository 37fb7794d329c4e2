"""``python -m reward_client score``: score one batch with local rewards or a reward service.

    python -m reward_client score --reward ocr=1 --reward jpeg_compressibility=0.1 \\
        --images batch.npy --prompts prompts.txt [--enqueue-url U --fetch-url U --token T | --local]
    python -m reward_client score --reward single_choice=1 --reward format=1 \
        --completions answers.json --references refs.json --prompts prompts.txt --local

batch.npy: uint8 images [B,H,W,C] or videos [B,C,T,H,W]; answers.json / refs.json: JSON lists of B
strings (text rewards, media_type "text"); prompts.txt: B lines. URLs and token
default to REMOTE_REWARD_* (legacy WFM_REWARD_*). Prints JSON {total, per_fn, uuids, timings}.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from reward_client import protocol
from reward_client.computer import RewardComputer
from reward_client.config import resolve_remote_config
from reward_client.errors import RewardError


def _reward_entry(text: str) -> dict:
    name, sep, weight = text.partition("=")
    try:
        return {"name": name, "weight": float(weight) if sep else 1.0}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--reward {text!r}: expected NAME=WEIGHT") from None


def _key_entry(text: str) -> tuple[str, str]:
    name, sep, key = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--score-key {text!r}: expected NAME=KEY (KEY may be a+b)")
    return name, key


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reward_client")
    sub = parser.add_subparsers(dest="command", required=True)
    score = sub.add_parser("score", help="score a batch and print JSON")
    score.add_argument("--reward", type=_reward_entry, action="append", required=True,
                       help="NAME=WEIGHT (repeatable)")
    score.add_argument("--score-key", type=_key_entry, action="append", default=[], help="NAME=KEY")
    media = score.add_mutually_exclusive_group(required=True)
    media.add_argument("--images", help=".npy uint8 [B,H,W,C] or [B,C,T,H,W]")
    media.add_argument("--completions", help="JSON list of completion strings (text rewards)")
    score.add_argument("--references", help="JSON list of reference answers, one per completion")
    score.add_argument("--prompts", required=True, help="text file, one prompt per line")
    score.add_argument("--media-type", choices=["image", "video"], default=None)
    score.add_argument("--local", action="store_true", help="run every reward in this process")
    score.add_argument("--enqueue-url")
    score.add_argument("--fetch-url")
    score.add_argument("--token")
    score.add_argument("--budget-s", type=float, default=300.0)
    score.add_argument("--scale", type=float, default=1.0)
    score.add_argument("--clip", type=float, default=5.0)
    return parser


def _json_strings(path: str, flag: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            items = json.load(f)
    except (OSError, ValueError) as exc:
        raise RewardError(f"cannot read {flag} {path}: {exc}") from None
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise RewardError(f"{flag} {path} must hold a JSON list of strings")
    return items


def _load(args) -> tuple[np.ndarray, list[str]]:
    if args.completions is not None:
        media = protocol.text_media(_json_strings(args.completions, "--completions"))
    else:
        if args.references is not None:
            raise RewardError("--references goes with --completions (text rewards), not --images")
        try:
            media = np.load(args.images, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise RewardError(f"cannot read --images {args.images}: {exc}") from None
    try:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    except OSError as exc:
        raise RewardError(f"cannot read --prompts {args.prompts}: {exc}") from None
    if len(prompts) != media.shape[0]:
        raise RewardError(f"--prompts {args.prompts} has {len(prompts)} prompts for "
                          f"{media.shape[0]} items in --{'completions' if args.completions else 'images'}")
    return media, prompts


def score(args) -> dict:
    keys = dict(args.score_key)
    fns = [dict(entry, score_key=keys.pop(entry["name"], None)) for entry in args.reward]
    if keys:
        raise RewardError(f"--score-key names {sorted(keys)} that no --reward names")
    if args.local:
        if args.enqueue_url or args.fetch_url or args.token:
            raise RewardError("--local cannot be combined with --enqueue-url/--fetch-url/--token")
        remote = None
    else:
        remote = resolve_remote_config({"enqueue_url": args.enqueue_url, "fetch_url": args.fetch_url,
                                        "token": args.token, "budget_s": args.budget_s})
        if remote is None:
            raise RewardError("no reward service: pass --enqueue-url and --fetch-url (or set "
                              "REMOTE_REWARD_ENQUEUE_URL / REMOTE_REWARD_FETCH_URL), or use --local")
        fns = [dict(f, local=False) for f in fns]
    media, prompts = _load(args)
    extras = None
    if args.references is not None:
        refs = _json_strings(args.references, "--references")
        if len(refs) != len(prompts):
            raise RewardError(f"--references has {len(refs)} answers for {len(prompts)} completions")
        extras = {"references": refs}
    with RewardComputer(fns, remote=remote, scale=args.scale, clip=args.clip) as computer:
        if remote is not None:
            computer.check_reachable(budget_s=min(30.0, args.budget_s))
        media_type = "text" if args.completions is not None else args.media_type
        result = computer.score(media, prompts, media_type=media_type, extras=extras)
    return {"total": result.total.tolist(), "per_fn": {k: v.tolist() for k, v in result.per_fn.items()},
            "uuids": result.uuids, "timings": result.timings}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = score(args)
    except RewardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
