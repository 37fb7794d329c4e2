"""The one name table of RL algorithms (train.train_policy.type -> RLAlgorithm subclass)."""
from __future__ import annotations

from wfm_jax.algorithms.base import AlgorithmConfigError, RLAlgorithm
from wfm_jax.algorithms.ddrl.algorithm import DDRL
from wfm_jax.algorithms.grpo.algorithm import GRPO
from wfm_jax.algorithms.nft.algorithm import NFT
from wfm_jax.algorithms.wfm.algorithm import WFMRL

# wfm_rl: cosmos-rl's world-model RL step (its Cosmos-Predict2.5 "GRPO" and DDRL recipes)
ALGORITHMS: dict[str, type[RLAlgorithm]] = {"nft": NFT, "grpo": GRPO, "ddrl": DDRL, "wfm_rl": WFMRL}


def algorithm_named(name: str) -> type[RLAlgorithm]:
    """The algorithm class of train.train_policy.type; one line naming the known ones else."""
    if name not in ALGORITHMS:
        raise AlgorithmConfigError(f"train.train_policy.type={name!r} has no RL trainer; "
                                   f"available: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
