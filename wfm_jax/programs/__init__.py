"""What gets compiled, in one place: the trainer runs these programs, the planner lowers them on
an abstract setup and the benchmark times them.

    programs = build(setup, algorithm=None)   # setup: train.setup.TrainSetup or abstract_setup(...)
    programs.sft_step / .rollout / .update / .evaluate / .sample   # Program or None
    programs.update.stats()                   # CompileStats on the recipe's abstract arguments
"""
from wfm_jax.programs.abstract import AbstractSetup, abstract_setup
from wfm_jax.programs.build import Program, Programs, build
from wfm_jax.programs.rl import RLLayout, rl_layout
from wfm_jax.programs.setup import Setup, SetupError
from wfm_jax.programs.stats import CompileStats

__all__ = ["AbstractSetup", "CompileStats", "Program", "Programs", "RLLayout", "Setup",
           "SetupError", "abstract_setup", "build", "rl_layout"]
