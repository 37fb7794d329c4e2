"""`plan.target`: the hardware a recipe is planned for, a TPU topology ("v5p:2x2x1") or GPUs
("h100:8"), as the planner (wfm_jax.plan) and the config check read it."""
from __future__ import annotations

import math
import re

from wfm_jax.config.base import ConfigError

# plan.target's device kinds: TPU generations libtpu describes (plan/topology.py), GPUs the
# planner has a memory size for (plan/args.py DEVICE_MEMORY)
TPU_TARGET_KINDS = ("v4", "v5e", "v5p", "v6e")
GPU_TARGET_KINDS = ("h100", "h200")


def parse_target(target: str) -> tuple[str, str, int]:
    """plan.target -> ("tpu", topology, chips) or ("gpu", kind, count); ConfigError naming the
    forms it takes."""
    t = str(target).strip().lower()
    tpu = re.fullmatch(r"(" + "|".join(TPU_TARGET_KINDS) + r"):(\d+)x(\d+)(?:x(\d+))?", t)
    if tpu:
        dims = [int(d) for d in tpu.groups()[1:] if d is not None]
        if all(d > 0 for d in dims):
            return "tpu", t, int(math.prod(dims))
    gpu = re.fullmatch(r"(" + "|".join(GPU_TARGET_KINDS) + r"):(\d+)", t)
    if gpu and int(gpu.group(2)) > 0:
        return "gpu", gpu.group(1), int(gpu.group(2))
    raise ConfigError(f"config key 'plan.target' = {target!r} is not a TPU topology "
                      f"('{TPU_TARGET_KINDS[2]}:2x2x1'; {', '.join(TPU_TARGET_KINDS)}) or GPUs "
                      f"('h100:8'; {', '.join(GPU_TARGET_KINDS)})")
