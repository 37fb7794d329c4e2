"""SANA-Video DiT (diffusers `SanaVideoTransformer3DModel`) in Flax NNX: the SANA block with
(a) Wan's Conv3d patch embedding, (b) Wan's interleaved 3D RoPE on the ReLU'd q and k of the
linear attention (numerator only; the normaliser uses them un-rotated), (c) the temporal conv
after the Mix-FFN. Timesteps are (B,) or per token (B, N); the final norm is modulated the same
way. Patch embedding, RoPE tables and the caption projection are the Wan port's (imported).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.attention import check_context_parallel_impl
from wfm_jax.models.sana.transformer import DEFAULTS as DEFAULTS_2D
from wfm_jax.models.sana.transformer import SanaBase, complete_config
from wfm_jax.models.wan.embeddings import PatchEmbed3D
from wfm_jax.models.wan.rope import rope_tables

# diffusers SanaVideoTransformer3DModel.__init__ defaults (no timestep_scale: the pipeline's)
DEFAULTS = {**{k: v for k, v in DEFAULTS_2D.items() if k != "timestep_scale"},
            **dict(in_channels=16, out_channels=16, num_attention_heads=20,
                   attention_head_dim=112, mlp_ratio=2.5, sample_size=30, patch_size=(1, 2, 2),
                   qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)}
# SANA-Video 2B 480p (diffusers convert_sana_video_to_diffusers.py; spec §1.4)
SANA_VIDEO_2B = dict(DEFAULTS, in_channels=16, out_channels=16, num_attention_heads=20,
                     attention_head_dim=112, num_layers=20, num_cross_attention_heads=20,
                     cross_attention_head_dim=112, cross_attention_dim=2240,
                     caption_channels=2304, mlp_ratio=3.0, sample_size=30, patch_size=(1, 2, 2),
                     qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)


def sana_video_config(config: dict) -> dict:
    cfg = complete_config(config, DEFAULTS, "SanaVideoTransformer3DModel")
    cfg["patch_size"] = tuple(cfg["patch_size"])
    return cfg


class SanaVideoTransformer(SanaBase):
    """SANA-Video velocity model: (B, C, T, H, W) latents -> (B, C_out, T, H, W)."""

    video = True

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 attention_impl="xla", remat: str = "everything_saveable", context_parallel_impl="auto",
                 scan_layers: bool = False, norm_checkpoints: bool = True):
        # linear attention splits over `context` with one psum of its K.V state, never Ulysses or
        # a ring: the option is accepted (one recipe key for every family) and only checked
        check_context_parallel_impl(context_parallel_impl)
        cfg = sana_video_config(config)
        super().__init__(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                         attention_impl=attention_impl, remat=remat,
                         scan_layers=scan_layers, norm_checkpoints=norm_checkpoints)
        self.head_dim, self.patch_size = cfg["attention_head_dim"], cfg["patch_size"]
        self.rope_max_seq_len = cfg["rope_max_seq_len"]
        self.patch_embedding = PatchEmbed3D(self.patch_size, cfg["in_channels"],
                                            cfg["num_attention_heads"] * self.head_dim,
                                            rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)

    def __call__(self, hidden_states, encoder_hidden_states, timestep, guidance=None,
                 encoder_attention_mask=None, attention_mask=None):
        """hidden_states (B, C, T, H, W); encoder_hidden_states (B, L, caption_channels);
        timestep (B,), scalar or (B, N) per token (the pipeline feeds int(1000 sigma));
        encoder_attention_mask (B, L) 1 = keep."""
        b = hidden_states.shape[0]
        x, grid = self.patch_embedding(jnp.asarray(hidden_states).astype(self.dtype))
        cos, sin = rope_tables(self.head_dim, grid, self.rope_max_seq_len)
        x = self._run(x, grid, (jnp.asarray(cos), jnp.asarray(sin)), encoder_hidden_states,
                      timestep, guidance, encoder_attention_mask, attention_mask)
        (f, h, w), (pt, ph, pw) = grid, self.patch_size
        x = x.reshape(b, f, h, w, pt, ph, pw, self.out_channels)
        x = jnp.einsum("bfhwtpqc->bcfthpwq", x)
        return x.reshape(b, self.out_channels, f * pt, h * ph, w * pw)
