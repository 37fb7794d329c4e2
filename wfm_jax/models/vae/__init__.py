"""The SD3 VAE (diffusers AutoencoderKL) in Flax NNX."""
from wfm_jax.models.vae.autoencoder_kl import (
                                               AutoencoderKL,
                                               DiagonalGaussian,
                                               VAEConfig,
                                               scale_latents,
                                               unscale_latents,
                                               vae_scale_factor,
)

__all__ = ["AutoencoderKL", "DiagonalGaussian", "VAEConfig", "scale_latents", "unscale_latents",
           "vae_scale_factor"]
