"""Host-side inputs shared by both stacks: the same numpy arrays go to jax and to torch."""
from __future__ import annotations

import numpy as np

SHIFT = 3.0  # SD3 / SD3.5 scheduler shift
SEED = 0  # the jax train state's rng key: the first step's noise and sigmas come from it
STEP_KEYS = ("x0", "noise", "sigmas", "timesteps", "ids")  # train_batch's non-text entries


def train_batch(suite, seed: int = SEED) -> dict[str, np.ndarray]:
    """x0 (clean latents), the family's text inputs, and the noise and per-sample
    sigmas / timesteps the wfm_jax SFT step (programs.sft) draws on its first call from a state
    whose rng is key(seed) for rows ids = 0..B-1 (logit-normal u -> index into the family's
    training table: SD3's shifted one, Cosmos' own range); timesteps are 1000 sigma (the family
    maps them for its model). The torch side trains on exactly these."""
    import jax

    from wfm_jax.programs.sft import step_draws
    rng = np.random.default_rng(seed)
    b = suite.train_batch
    latent = suite.workload.latent_shape(suite, b)
    x0 = rng.standard_normal(latent, dtype=np.float32)
    text = suite.workload.text_inputs(suite, b, rng)
    table_t, table_s = suite.workload.train_sigma_table(suite)
    ids = np.arange(b, dtype=np.int32)
    key = jax.random.split(jax.random.key(seed))[1]  # as the step splits its state's rng
    timesteps, sigmas, noise = jax.device_get(step_draws(
        key, ids, latent[1:], np.asarray(table_t), np.asarray(table_s), "logit_normal"))
    # writable copies: torch.from_numpy refuses read-only device_get buffers
    return {"x0": x0, "noise": np.array(noise, np.float32), "sigmas": np.array(sigmas, np.float32),
            "timesteps": np.array(timesteps, np.float32), "ids": ids, **text}


def text_of(batch: dict) -> dict[str, np.ndarray]:
    """The conditioning entries of a train batch (the family's velocity_with keys)."""
    return {k: v for k, v in batch.items() if k not in STEP_KEYS}


def rollout_batch(suite, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = suite.rollout_batch
    return {"noise": rng.standard_normal(suite.workload.latent_shape(suite, b), dtype=np.float32),
            **suite.workload.text_inputs(suite, b, rng)}


def reward_batch(shape, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
