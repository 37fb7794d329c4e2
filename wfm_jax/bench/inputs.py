"""Host-side inputs shared by both stacks: the same numpy arrays go to jax and to torch."""
from __future__ import annotations

import numpy as np

SHIFT = 3.0  # SD3 / SD3.5 scheduler shift


def train_batch(suite, seed: int = 0) -> dict[str, np.ndarray]:
    """x0 (clean latents), noise, per-sample sigmas/timesteps drawn as wfm_jax's SFT does
    (logit-normal u -> index into the family's training table: SD3's shifted one, Cosmos' own
    range), and the family's text inputs; timesteps are 1000 sigma (the family maps them for its
    model)."""
    rng = np.random.default_rng(seed)
    b = suite.train_batch
    latent = suite.workload.latent_shape(suite, b)
    u = 1.0 / (1.0 + np.exp(-rng.standard_normal(b)))
    table_t, table_s = suite.workload.train_sigma_table(suite)
    idx = np.clip(np.floor(u * len(table_t)).astype(np.int64), 0, len(table_t) - 1)
    return {"x0": rng.standard_normal(latent, dtype=np.float32),
            "noise": rng.standard_normal(latent, dtype=np.float32),
            "sigmas": table_s[idx].astype(np.float32),
            "timesteps": table_t[idx].astype(np.float32),
            **suite.workload.text_inputs(suite, b, rng)}


def rollout_batch(suite, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = suite.rollout_batch
    return {"noise": rng.standard_normal(suite.workload.latent_shape(suite, b), dtype=np.float32),
            **suite.workload.text_inputs(suite, b, rng)}


def reward_batch(shape, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
