"""The VAE half of every family that encodes and decodes with AutoencoderKLWan (Wan2.1,
Cosmos-Predict2.5, SANA-Video): one implementation of PipelineFamily's posterior_with /
normalize_latents / decode_with, mixed into each family class."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from wfm_jax.models.wan.vae import scale_latents, unscale_latents


class WanVideoLatents:
    """Needs `self.vae_config` (the VAE's config.json, with latents_mean / latents_std) and
    `self.display_name` (for messages)."""

    vae_config: dict
    display_name: str | None

    def posterior_with(self, vae, pixels) -> tuple[jax.Array, jax.Array]:
        """(B, T, H, W, 3) in [-1, 1], T = 4k+1 -> posterior (mean, std), (B, z, k+1, h, w)."""
        if pixels.ndim != 5 or pixels.shape[-1] != 3:
            raise ValueError(f"{self.display_name} encodes video (batch, frames, height, width, "
                             f"3); got {tuple(pixels.shape)}")
        dist = vae.encode(jnp.moveaxis(jnp.asarray(pixels), -1, 1))
        return dist.mean, dist.std

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """(z - latents_mean) / latents_std, per channel, as diffusers' Wan-VAE pipelines."""
        return scale_latents(z, self.vae_config)

    def decode_with(self, vae, latents) -> jax.Array:
        """Normalised latents (B, C, T', h, w) -> (B, 4T'-3, H, W, 3) in [0, 1], as the
        pipelines with output_type="np": VideoProcessor's (x / 2 + 0.5).clamp(0, 1) (4k+1
        frames: Cosmos' _match_num_frames leaves them alone)."""
        video = vae.decode(unscale_latents(latents, self.vae_config))
        video = jnp.clip(video.astype(jnp.float32) / 2 + 0.5, 0.0, 1.0)
        return jnp.transpose(video, (0, 2, 3, 4, 1))
