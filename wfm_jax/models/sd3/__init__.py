"""SD3 / SD3.5 MMDiT (diffusers SD3Transformer2DModel) in Flax NNX."""
from wfm_jax.models.sd3.transformer import REMAT_POLICIES, SD3Transformer, sd3_config

__all__ = ["REMAT_POLICIES", "SD3Transformer", "sd3_config"]
