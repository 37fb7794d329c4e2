"""Cosmos-Predict2.5 in Flax NNX: the DiT (diffusers CosmosTransformer3DModel: transformer.py,
blocks.py, attention.py, rope.py, embeddings.py)."""
from wfm_jax.models.cosmos.transformer import (
                                               COSMOS25_PREDICT_2B,
                                               COSMOS25_PREDICT_14B,
                                               CosmosTransformer,
                                               cosmos_config,
)

__all__ = ["COSMOS25_PREDICT_2B", "COSMOS25_PREDICT_14B", "CosmosTransformer", "cosmos_config"]
