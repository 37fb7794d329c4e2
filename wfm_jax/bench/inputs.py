"""Host-side inputs shared by both stacks: the same numpy arrays go to jax and to torch."""
from __future__ import annotations

import numpy as np

from wfm_jax.sampling.schedule import training_table

SHIFT = 3.0  # SD3 / SD3.5 scheduler shift


def train_batch(suite, seed: int = 0) -> dict[str, np.ndarray]:
    """x0 (clean latents), noise, per-sample sigmas/timesteps drawn as SD3 training does
    (logit-normal u -> index into the shifted table), text embeddings and pooled projections."""
    cfg = suite.transformer
    rng = np.random.default_rng(seed)
    b, s = suite.train_batch, suite.latent_size
    latent = (b, cfg["in_channels"], s, s)
    u = 1.0 / (1.0 + np.exp(-rng.standard_normal(b)))
    table_t, table_s = training_table(SHIFT)
    idx = np.clip(np.floor(u * len(table_t)).astype(np.int64), 0, len(table_t) - 1)
    return {"x0": rng.standard_normal(latent, dtype=np.float32),
            "noise": rng.standard_normal(latent, dtype=np.float32),
            "sigmas": table_s[idx].astype(np.float32),
            "timesteps": table_t[idx].astype(np.float32),
            **text_inputs(cfg, b, suite.text_len, rng)}


def rollout_batch(suite, seed: int = 1) -> dict[str, np.ndarray]:
    cfg = suite.transformer
    rng = np.random.default_rng(seed)
    b, s = suite.rollout_batch, suite.latent_size
    return {"noise": rng.standard_normal((b, cfg["in_channels"], s, s), dtype=np.float32),
            **text_inputs(cfg, b, suite.text_len, rng)}


def text_inputs(cfg: dict, batch: int, text_len: int, rng) -> dict[str, np.ndarray]:
    return {"prompt_embeds": rng.standard_normal((batch, text_len, cfg["joint_attention_dim"]),
                                                 dtype=np.float32),
            "pooled_projections": rng.standard_normal((batch, cfg["pooled_projection_dim"]),
                                                      dtype=np.float32)}


def reward_batch(shape, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
