"""Wan2.1 in Flax NNX: the video VAE (vae.py, vae_layers.py)."""
