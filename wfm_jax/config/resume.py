"""A resumed run against the config its checkpoints were trained with (output_dir/config.json).

Keys that change what a checkpoint holds or how its data position and schedule are counted are
refused (one line naming them); other changed keys are allowed with one warning line; keys a
resume is expected to change (max_steps, resume itself, process layout, logging) pass silently.
"""
from __future__ import annotations

import json
import os
import sys

from wfm_jax.config.base import ConfigError, is_secret, to_plain

# a checkpoint trained under one value means something else (or does not fit) under another
REFUSED = (
    "train.train_policy.type",                   # the algorithm and its stored state
    "policy.lora.enable", "policy.lora.r", "policy.lora.lora_alpha",
    "policy.lora.target_modules",                # which parameters the state holds
    "train.ema_enable",                          # whether the state holds an EMA shadow
    "train.grad_accum_steps",                    # the optimizer's accumulation state
    "train.train_batch_per_replica",             # the data position and schedule are in batches
    "rollout.n_generation",                      # RL groups: prompts per batch
)
# expected to differ between a run and its resume
IGNORED_PREFIXES = ("train.resume", "train.max_steps", "train.output_dir", "distributed.",
                    "train.wandb.")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _changes(stored: dict, current: dict) -> list[tuple[str, object, object]]:
    old, new = _flat(stored), _flat(current)
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys
            if old.get(k) != new.get(k) and not is_secret(k)
            and not k.startswith(IGNORED_PREFIXES)]


def _listed(changes) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)


def check_resumed_config(config, path: str) -> list[str]:
    """Compare `config` with the stored config.json at `path` (absent: nothing to compare).
    Raises ConfigError naming refused changes; returns the names of allowed changed keys after
    printing one warning line about them."""
    if not os.path.isfile(path):
        return []
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {path} to compare the resumed config: {e}") from None
    changes = _changes(stored, to_plain(config))
    refused = [c for c in changes if c[0] in REFUSED]
    if refused:
        raise ConfigError(f"resuming with a config its checkpoints were not trained with "
                          f"({path}): {_listed(refused)}; resume with the stored values or "
                          f"choose a new train.output_dir")
    if changes:
        print(f"warning: resuming with changed config keys (allowed): {_listed(changes)}",
              file=sys.stderr, flush=True)
    return [c[0] for c in changes]
