"""SANA1.5 and SANA-Video DiTs in Flax NNX (diffusers SanaTransformer2DModel and
SanaVideoTransformer3DModel): linear_attention.py, cross_attention.py, glumbconv.py,
embeddings.py, block.py, transformer.py (2D + shared base), video.py."""
from wfm_jax.models.sana.transformer import SANA15_1600M, SanaTransformer, sana_config
from wfm_jax.models.sana.video import SANA_VIDEO_2B, SanaVideoTransformer, sana_video_config

__all__ = [
           "SANA15_1600M",
           "SANA_VIDEO_2B",
           "SanaTransformer",
           "SanaVideoTransformer",
           "sana_config",
           "sana_video_config",
]
