"""The algorithms as array functions: losses, advantages, averaging (spec algorithms.md), and the
RL algorithms on the shared loop (base.RLAlgorithm; nft/, grpo/, ddrl/; registry.ALGORITHMS).
Nothing here imports the trainer, planner, benchmark, programs or recipe schema."""

from wfm_jax.algorithms.advantages import clip_advantages, ddrl_advantages, group_advantages, nft_optimality
from wfm_jax.algorithms.ddrl import ddrl_data_loss, ddrl_loss, ddrl_policy_loss, draw_data_sigma, edm_noisy
from wfm_jax.algorithms.decay import old_policy_decay, soft_update
from wfm_jax.algorithms.grpo import closed_form_kl, grpo_loss, ppo_clipped_loss
from wfm_jax.algorithms.nft import nft_loss, train_timesteps, trained_step_count
from wfm_jax.algorithms.sft import (
    flow_matching_loss,
    loss_weighting,
    noisy_latents,
    sample_density,
    sample_training_timesteps,
    table_indices,
)

__all__ = [
    "clip_advantages",
    "closed_form_kl",
    "ddrl_advantages",
    "ddrl_data_loss",
    "ddrl_loss",
    "ddrl_policy_loss",
    "draw_data_sigma",
    "edm_noisy",
    "flow_matching_loss",
    "group_advantages",
    "grpo_loss",
    "loss_weighting",
    "nft_loss",
    "nft_optimality",
    "noisy_latents",
    "old_policy_decay",
    "ppo_clipped_loss",
    "sample_density",
    "sample_training_timesteps",
    "table_indices",
    "train_timesteps",
    "trained_step_count",
]
__all__ += ["soft_update"]
