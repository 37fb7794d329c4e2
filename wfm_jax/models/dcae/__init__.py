"""SANA's image VAE (diffusers AutoencoderDC) in Flax NNX."""
from wfm_jax.models.dcae.autoencoder_dc import AutoencoderDC, DCAEConfig, make_model, scale_latents, unscale_latents

__all__ = ["AutoencoderDC", "DCAEConfig", "make_model", "scale_latents", "unscale_latents"]
