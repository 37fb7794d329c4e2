"""Flow-GRPO: the loss (loss.py: PPO clip + closed-form KL) and the algorithm on the shared RL
loop (algorithm.py: GRPO, GRPOConfig)."""
from wfm_jax.algorithms.grpo.algorithm import GRPO, GRPOConfig, cfg_velocity, full_uncond, guide_of
from wfm_jax.algorithms.grpo.loss import closed_form_kl, grpo_loss, ppo_clipped_loss, weighted_mean

__all__ = ["GRPO", "GRPOConfig", "cfg_velocity", "closed_form_kl", "full_uncond", "grpo_loss",
           "guide_of", "ppo_clipped_loss", "weighted_mean"]
