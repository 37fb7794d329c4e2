"""DDRL: the loss (loss.py: policy, KL and data terms) and the algorithm on the shared RL loop
(algorithm.py: DDRL, DDRLConfig)."""
from wfm_jax.algorithms.ddrl.algorithm import DDRL, DDRLConfig, edm_x0, resolve_train_on, step_mean
from wfm_jax.algorithms.ddrl.loss import (
    ddrl_data_loss,
    ddrl_loss,
    ddrl_policy_loss,
    draw_data_sigma,
    edm_loss_weight,
    edm_noisy,
    unscaled_log_ratio,
)

__all__ = ["DDRL", "DDRLConfig", "ddrl_data_loss", "ddrl_loss", "ddrl_policy_loss",
           "draw_data_sigma", "edm_loss_weight", "edm_noisy", "edm_x0", "resolve_train_on",
           "step_mean", "unscaled_log_ratio"]
