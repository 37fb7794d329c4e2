"""Text encoders SD3 uses: CLIP (with projection) and the T5 v1.1 encoder."""
from wfm_jax.models.text.clip import CLIPTextConfig, CLIPTextEncoder  # noqa: F401
from wfm_jax.models.text.t5 import T5Config, T5Encoder  # noqa: F401
