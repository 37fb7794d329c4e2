"""Flow-matching schedules, per-step update rules and lax.scan samplers (spec algorithms.md)."""

from wfm_jax.sampling.guidance import guided_velocity, paired_cond, uses_cfg
from wfm_jax.sampling.samplers import METHODS, SampleOutput, draw_window_start, sample, window_mask
from wfm_jax.sampling.schedule import edm_churn_eta, edm_sigmas, flow_sigmas, training_table

__all__ = [
    "METHODS",
    "SampleOutput",
    "draw_window_start",
    "edm_churn_eta",
    "edm_sigmas",
    "flow_sigmas",
    "guided_velocity",
    "paired_cond",
    "sample",
    "training_table",
    "uses_cfg",
    "window_mask",
]
