"""Wan2.1 in Flax NNX: the DiT (diffusers WanTransformer3DModel: transformer.py, attention.py,
rope.py, embeddings.py), the video VAE (AutoencoderKLWan: vae.py, vae_layers.py); its
WanPipeline model family lives in wfm_jax.families.wan."""
from wfm_jax.models.wan.transformer import WAN21_T2V_1_3B, WAN21_T2V_14B, WanTransformer, wan_config

__all__ = ["WAN21_T2V_1_3B", "WAN21_T2V_14B", "WanTransformer", "wan_config"]
