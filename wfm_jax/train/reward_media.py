"""One batch of samples as the rewards take it (train.train_policy.remote_reward.media_type)."""
from __future__ import annotations

import jax
import numpy as np


def reward_media(media_type: str, pixels, latents=None) -> tuple[np.ndarray, str]:
    """-> (media, protocol media_type) for RewardComputer.submit.

    "pixels": uint8 pixels as decoded, (B, H, W, 3) -> "image", (B, T, H, W, 3) -> "video"
    [B, C, T, H, W] (the protocol's video layout). "latent": the normalised latents the
    transformer produced, [B, C, T, h, w] as float16 (what cosmos-rl's trainer sends).
    """
    if media_type == "latent":
        if latents is None:
            raise ValueError("reward media_type 'latent' needs the rollout's latents")
        return np.asarray(jax.device_get(latents)).astype(np.float16), "latent"
    pixels = np.asarray(jax.device_get(pixels))
    if pixels.dtype != np.uint8:
        raise ValueError(f"reward pixels must be uint8, got {pixels.dtype}")
    if pixels.ndim == 5:
        return np.ascontiguousarray(np.moveaxis(pixels, -1, 1)), "video"
    if pixels.ndim == 4:
        return pixels, "image"
    raise ValueError(f"decoded pixels must be (B, H, W, 3) or (B, T, H, W, 3), got "
                     f"{pixels.shape}")
