"""Two-way weight converters between diffusers/transformers safetensors and wfm_jax state."""
from converters.table import ConversionError, Rule  # noqa: F401
