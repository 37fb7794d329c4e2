"""Run an RL recipe with its advantages permuted across each batch: the same values, no longer
tied to the samples they were computed for, so the update carries no reward signal. Compared
with the same recipe and seed run normally, it separates what the reward teaches from what the
update does by itself (docs/tiny_rl_diagnosis.md, "a control with shuffled advantages").

    python tools/rl_shuffled_advantages.py [--shuffle-seed S] --config configs/tiny_grpo.py [overrides]
"""
from __future__ import annotations

import sys

import numpy as np

from wfm_jax.cli.main import main
from wfm_jax.train import rl


def shuffle_advantages(seed: int) -> None:
    """Wrap rl.advantages_for so that every step's advantages come back permuted."""
    real = rl.advantages_for
    rng = np.random.default_rng(seed)

    def shuffled(run, rollout, batch):
        adv, metrics = real(run, rollout, batch)
        return adv[rng.permutation(len(adv))], metrics

    rl.advantages_for = shuffled


if __name__ == "__main__":
    argv = sys.argv[1:]
    seed = 0
    if argv[:1] == ["--shuffle-seed"]:
        seed, argv = int(argv[1]), argv[2:]
    shuffle_advantages(seed)
    sys.exit(main(argv))
