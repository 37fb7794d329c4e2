"""The tiny SD3 pipeline at a chosen depth, and the planner's arguments for planning its SFT
recipe on it (the libtpu tests of tests/plan share them)."""
from __future__ import annotations

import json
import os


def tiny_sd3_plan_argv(directory: str, num_layers: int) -> list[str]:
    """Write the tiny SD3 pipeline with `num_layers` blocks at `directory`; the planner's
    arguments for configs/tiny_sft.py on it (no topology, no --layers: the caller adds them)."""
    from wfm_jax.families.tiny import build_tiny_pipeline

    build_tiny_pipeline(directory, seed=0, family="sd3")
    path = os.path.join(directory, "transformer", "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(config, num_layers=num_layers), f)
    return ["--config", "configs/tiny_sft.py", f"--config.policy.model_name_or_path={directory}",
            "--config.policy.build_tiny=False", "--config.policy.build_tiny_pretrained=False",
            "--config.train.train_policy.dataset.build_tiny=False"]
