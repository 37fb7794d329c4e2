"""wfm_jax.plan: a recipe's per-device memory, FLOPs and collectives before any weight is read
(cli.py: the command; args.py: its arguments; report.py: plan / describe / check_fits, over the
programs programs.build makes on programs.abstract_setup: what the trainers run)."""
from wfm_jax.plan.args import DEVICE_MEMORY, GiB
from wfm_jax.plan.cli import main, parse_args
from wfm_jax.plan.report import MEMORY_ENV, check_fits, describe, fit_line, plan
from wfm_jax.programs.stats import collective_bytes

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
