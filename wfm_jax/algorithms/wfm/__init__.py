"""cosmos-rl's world-model RL step on the shared loop (algorithm.py: WFMRL, registered as
"wfm_rl"); its array functions live in algorithms.wfm_rl, its sampler in sampling.edm."""
from wfm_jax.algorithms.wfm.algorithm import WFMRL, WFMRLAlgorithmConfig

__all__ = ["WFMRL", "WFMRLAlgorithmConfig"]
