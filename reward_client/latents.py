"""Decoding latent payloads in the reference server: Wan2.1 VAE latents -> uint8 videos.

A trainer sending media_type "latent" (as cosmos-rl's video trainer does) sends the latents its
transformer works in: float [B, z_dim, T, h, w], normalised per channel as (z - mean) / std. The
server de-normalises them as diffusers' WanPipeline does before `vae.decode`
(latents / (1 / std) + mean, with the VAE config's latents_mean / latents_std), decodes with the
Flax AutoencoderKLWan, maps [-1, 1] to [0, 1] as diffusers' video processor does and rounds to
uint8 [B, C, 4(T-1)+1, 8h, 8w], the layout the video rewards score.
"""
from __future__ import annotations

import numpy as np

from reward_client.errors import RewardConfigError, RewardProtocolError


class LatentDecoder:
    """The VAE of a diffusers pipeline dir (model_index.json + vae/), or of a vae dir itself."""

    def __init__(self, pipeline_dir: str):
        import jax
        from flax import nnx

        from converters.loading import load_model
        from wfm_jax.models.wan.vae import AutoencoderKLWan, unscale_latents

        try:
            vae, config = load_model(pipeline_dir, component="vae")
        except (OSError, ValueError) as exc:
            raise RewardConfigError(f"cannot load a VAE from {pipeline_dir}: {exc}") from None
        if not isinstance(vae, AutoencoderKLWan):
            raise RewardConfigError(f"the VAE in {pipeline_dir} is a {config.get('_class_name')}; "
                                    "latent payloads are decoded with AutoencoderKLWan (Wan2.1) only")
        self.z_dim = vae.config.z_dim
        self.directory = pipeline_dir
        graph, state = nnx.split(vae)

        def decode(state, latents):
            import jax.numpy as jnp
            model = nnx.merge(graph, state)
            video = model.decode(unscale_latents(latents.astype(jnp.float32), model.config))
            pixels = jnp.clip(video / 2 + 0.5, 0.0, 1.0)  # diffusers' postprocess
            return jnp.round(pixels * 255).astype(jnp.uint8)

        self._decode = jax.jit(decode)
        self._state = state

    def check(self, latents: np.ndarray) -> None:
        """RewardProtocolError (a 4xx) for latents this VAE cannot decode."""
        if latents.ndim != 5 or latents.shape[1] != self.z_dim:
            raise RewardProtocolError(f"latents of shape {tuple(latents.shape)}: this server's VAE "
                                      f"decodes [B,{self.z_dim},T,H,W]")
        if not np.isfinite(latents).all():
            raise RewardProtocolError("latents hold NaN or inf values")

    def __call__(self, latents: np.ndarray) -> np.ndarray:
        """float [B, z_dim, T, h, w] normalised latents -> uint8 video [B, 3, 4T-3, 8h, 8w]."""
        self.check(latents)
        return np.asarray(self._decode(self._state, np.asarray(latents)))
