"""wfm_jax.plan: a recipe's per-device memory, FLOPs and collectives before any weight is read
(cli.py: the command; report.py: plan / describe / check_fits; steps.py: the trainers' programs
compiled abstractly; abstract.py: weightless pipeline and train state; released.py: released
shapes)."""
from wfm_jax.plan.cli import main, parse_args
from wfm_jax.plan.report import DEVICE_MEMORY, MEMORY_ENV, GiB, check_fits, describe, fit_line, plan
from wfm_jax.plan.steps import collective_bytes

__all__ = [
           "DEVICE_MEMORY",
           "MEMORY_ENV",
           "GiB",
           "check_fits",
           "collective_bytes",
           "describe",
           "fit_line",
           "main",
           "parse_args",
           "plan",
]
