"""Wan2.1 (diffusers WanTransformer3DModel) in Flax NNX."""
from wfm_jax.models.wan.transformer import (WAN21_T2V_1_3B, WAN21_T2V_14B, WanTransformer,
                                            wan_config)

__all__ = ["WanTransformer", "wan_config", "WAN21_T2V_1_3B", "WAN21_T2V_14B"]
