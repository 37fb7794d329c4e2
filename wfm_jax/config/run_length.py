"""How many steps a run lasts, by cosmos-rl's rule, once the size of the training set is known.

cosmos-rl (nvidia-cosmos/cosmos-rl):
- SFT, policy/worker/sft_worker.py: total = len(train loader) * train.epoch; the loader's
  batches per epoch are floor(samples / batch) (train_policy.dataloader_drop_last, default true);
  with train.max_num_steps set, min(the two). The LR schedule spans that total.
- RL, dispatcher/data/data_fetcher.py + dispatcher/status.py (recompute_total_steps): total =
  samples * rollout.n_generation * train.epoch // (train_batch_per_replica * policy replicas),
  min(that, max_num_steps) when set.
Here train_batch_per_replica is the global batch (summed over devices) and an SFT step takes
grad_accum_steps of them.

train.max_steps (cosmos-rl's max_num_steps) and train.epoch are both unset by default:
- max_steps only: exactly max_steps steps (wfm_jax's recipes; the data repeats as needed);
- epoch only, or neither (cosmos-rl's default epoch 1): epoch passes over the data;
- both: the smaller, as cosmos-rl. A cosmos-rl TOML always sets epoch (1 when it says nothing),
  so it runs as in cosmos-rl.
"""
from __future__ import annotations

import json
import os

from wfm_jax.config.base import ConfigError


def steps_by_dataset(samples: int, *, sft: bool, batch: int, epoch: int, n_generation: int = 1,
                     grad_accum_steps: int = 1) -> int:
    """Steps of `epoch` passes over `samples` training items (SFT: examples; RL: prompts, each
    rolled out n_generation times in a batch of `batch` rows)."""
    if epoch < 1:
        raise ConfigError(f"config key 'train.epoch' must be > 0, got {epoch}")
    if min(batch, n_generation, grad_accum_steps) < 1 or samples < 0:
        raise ValueError(f"samples={samples}, batch={batch}, n_generation={n_generation} and "
                         f"grad_accum_steps={grad_accum_steps} must be >= 0 / >= 1")
    if sft:  # whole batches per epoch (the last short one dropped), times the epochs
        return samples // (batch * grad_accum_steps) * epoch
    return samples * n_generation * epoch // batch  # every rollout row of every pass, in batches


def run_steps(config, samples: int | None, what: str = "training samples") -> int:
    """The run's step count from its config and its training set's size (None: unknown, e.g.
    streamed WebDataset shards); a ConfigError when it cannot be had or would be 0."""
    t = config.train
    cap, epoch = t.max_steps, t.epoch
    if epoch is None and cap is not None:
        return int(cap)
    epoch = 1 if epoch is None else int(epoch)
    if samples is None:
        if cap is not None:  # epoch cannot bound a stream of unknown length: the cap does
            return int(cap)
        raise ConfigError(f"train.max_steps is unset and the number of {what} is not known "
                          f"before training (streamed shards), so train.epoch cannot set the run "
                          f"length: set --config.train.max_steps=N")
    sft = t.train_policy.type == "sft"
    steps = steps_by_dataset(int(samples), sft=sft, batch=int(t.train_batch_per_replica),
                             epoch=epoch, n_generation=int(config.rollout.n_generation),
                             grad_accum_steps=int(t.grad_accum_steps))
    if steps == 0:
        step = (f"{int(t.train_batch_per_replica) * int(t.grad_accum_steps)} (train_batch_per_replica"
                f" x grad_accum_steps)" if sft else
                f"{int(t.train_batch_per_replica) // int(config.rollout.n_generation)} "
                f"(train_batch_per_replica / rollout.n_generation)")
        raise ConfigError(f"train.epoch={epoch} pass(es) over {samples} {what} make no full step "
                          f"of {step}: the run would have 0 steps; use more data, a smaller batch, "
                          f"more epochs or set train.max_steps without train.epoch")
    return steps if cap is None else min(steps, int(cap))


def resolve_max_steps(config, samples: int | None, what: str = "training samples") -> int:
    """Set train.max_steps to the run's length (run_steps) before anything reads it (the LR
    schedule, the loop, config.json), say how it was reached when the data decided, and return
    it. A resume recomputes it from the same data; a different number is said too."""
    from wfm_jax.core.console import say
    t = config.train
    explicit = t.max_steps
    steps = run_steps(config, samples, what)
    t.max_steps = steps
    if t.epoch is None and explicit is not None:  # a plain step count: nothing to say
        return steps
    if samples is None:
        say(f"note: train.epoch={t.epoch} is not applied (the number of {what} is not known "
            f"before training); the run lasts train.max_steps={steps} steps")
        return steps
    epoch = 1 if t.epoch is None else int(t.epoch)
    capped = f", capped by train.max_steps={explicit}" if explicit is not None and steps == explicit else ""
    say(f"run length: {steps} steps ({epoch} epoch(s) over {samples} {what}{capped})")
    before = _stored_steps(config)
    if t.resume and before is not None and before != steps:
        say(f"note: the run started with {before} steps; the training set or train.epoch changed, "
            f"so it now lasts {steps}")
    return steps


def _stored_steps(config) -> int | None:
    """train.max_steps of the config.json the run's first start wrote, if any."""
    try:
        with open(os.path.join(config.train.output_dir, "config.json")) as f:
            value = json.load(f).get("train", {}).get("max_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None
