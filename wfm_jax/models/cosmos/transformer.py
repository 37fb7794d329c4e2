"""Cosmos-Predict2.5 DiT (diffusers `CosmosTransformer3DModel`) in Flax NNX.

Built from the diffusers config.json dict. Covers the Predict2.5 base models (2B, 14B:
COSMOS25_PREDICT_2B, COSMOS25_PREDICT_14B below): adaLN-LoRA blocks, rotate-half NTK RoPE,
per-head QK RMS norm, the optional `crossattn_proj` (Qwen2.5-VL all-layer features -> 1024),
the [latent, condition mask, padding mask] patch embedding and per-frame timesteps. The learnable
extra position embedding (Predict2), the image context (Transfer/Predict2.5-I2V variants) and
ControlNet residuals are refused by name.
Precision: residual stream and projections in the compute dtype; the time embedding, adaLN-LoRA
modulation, norms, RoPE and the gated residual sums in fp32.
"""
from __future__ import annotations

import math
import numbers
import warnings

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.cosmos.blocks import AdaLayerNormLoRA, CosmosTransformerBlock
from wfm_jax.models.cosmos.embeddings import CosmosTimeEmbedding, PatchEmbed, resize_nearest
from wfm_jax.models.cosmos.rope import check_head_dim, rope_tables
from wfm_jax.models.layers.attention import check_attention_impl
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import traced_with_norm_checkpoints
from wfm_jax.models.layers.remat import check_remat, run_blocks

# diffusers CosmosTransformer3DModel.__init__ defaults
DEFAULTS = dict(in_channels=16, out_channels=16, num_attention_heads=32, attention_head_dim=128,
                num_layers=28, mlp_ratio=4.0, text_embed_dim=1024, adaln_lora_dim=256,
                max_size=(128, 240, 240), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
                concat_padding_mask=True, extra_pos_embed_type="learnable",
                use_crossattn_projection=False, crossattn_proj_in_channels=1024,
                encoder_hidden_states_channels=1024, controlnet_block_every_n=None,
                img_context_dim_in=None, img_context_num_tokens=256, img_context_dim_out=2048)
# The released configs (diffusers' scripts/convert_cosmos_to_diffusers.py
# "Cosmos-2.5-Predict-Base-2B" / "-14B"; spec video_models.md §1.1).
COSMOS25_PREDICT_2B = dict(
    DEFAULTS, in_channels=17, out_channels=16, num_attention_heads=16, attention_head_dim=128,
    num_layers=28, mlp_ratio=4.0, text_embed_dim=1024, adaln_lora_dim=256,
    max_size=(128, 240, 240), patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0),
    concat_padding_mask=True, extra_pos_embed_type=None, use_crossattn_projection=True,
    crossattn_proj_in_channels=100352, encoder_hidden_states_channels=1024)
COSMOS25_PREDICT_14B = dict(COSMOS25_PREDICT_2B, num_attention_heads=40, num_layers=36)

TOKEN_AXES = ("act_batch", "act_seq", "act_embed")


def cosmos_config(config: dict) -> dict:
    """diffusers config.json dict -> complete config (defaults filled in, unknown keys warned)."""
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        warnings.warn(f"CosmosTransformer3DModel config: ignoring unknown keys {unknown}",
                      stacklevel=2)
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if k in DEFAULTS}}
    for key in ("max_size", "patch_size", "rope_scale"):
        cfg[key] = tuple(cfg[key])
    if cfg["extra_pos_embed_type"] is not None:
        raise ValueError(f"CosmosTransformer3DModel with extra_pos_embed_type="
                         f"{cfg['extra_pos_embed_type']!r} (Cosmos-Predict2) is not supported; "
                         "only the Predict2.5 configs (extra_pos_embed_type=None) are")
    if cfg["img_context_dim_in"]:
        raise ValueError("CosmosTransformer3DModel with img_context_dim_in (image context) is "
                         "not supported")
    check_head_dim(cfg["attention_head_dim"])
    return cfg


def _timesteps(timestep, batch: int, frames: int, patch_t: int):
    """(B,) / (1,) / () or (B, 1, T, 1, 1) -> (flat (N,) fp32, frames per sample F)."""
    t = jnp.asarray(timestep, jnp.float32)
    if t.ndim <= 1:
        if t.size not in (1, batch):
            raise ValueError(f"timestep of shape {t.shape} does not match batch size {batch}")
        return jnp.broadcast_to(t.reshape(-1), (batch,)), 1
    if t.ndim == 5:
        if t.shape != (batch, 1, frames, 1, 1):
            raise ValueError(f"per-frame timestep must have shape [B, 1, T, 1, 1] = "
                             f"{(batch, 1, frames, 1, 1)}, got {t.shape}")
        if patch_t != 1:
            raise ValueError(f"per-frame timesteps need patch_size[0] == 1, got {patch_t}")
        return t.reshape(-1), frames
    raise ValueError(f"timestep must have shape [B] or [B, 1, T, 1, 1], got {t.shape}")


class CosmosTransformer(nnx.Module):
    """Cosmos velocity model; call layout and meaning identical to the diffusers forward.

    dtype: compute dtype (None: param_dtype); param_dtype: master weight dtype.
    attention_impl: "xla", "cudnn", "auto" or None, as for the SD3 and Wan models.
    context_parallel_impl: "auto" | "ulysses" | "ring" for the self-attention when a mesh splits
    the tokens over `context` (layers.context_parallel); cross-attention stays local.
    remat: a layers.remat.REMAT_POLICIES name, per block; scan_layers: run the (identical)
    blocks as one lax.scan over their stacked weights (same parameters either way).
    Parameter paths are diffusers module names ("transformer_blocks.3.attn1.to_q.kernel").
    """

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 attention_impl="xla", remat: str = "everything_saveable", context_parallel_impl="auto",
                 scan_layers: bool = False, norm_checkpoints: bool = True):
        cfg = cosmos_config(config)
        self._config_items = tuple(sorted(cfg.items()))  # hashable: part of the static graph
        self.dtype = jnp.dtype(dtype or param_dtype)
        check_attention_impl(attention_impl, self.dtype)
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self.remat, self.scan_layers = remat, bool(scan_layers)
        self.norm_checkpoints = bool(norm_checkpoints)  # layers/norms.py
        heads, head_dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
        dim = heads * head_dim
        self.head_dim, self.patch_size = head_dim, cfg["patch_size"]
        self.in_channels, self.out_channels = cfg["in_channels"], cfg["out_channels"]
        self.concat_padding_mask = cfg["concat_padding_mask"]
        self.rope_scale = cfg["rope_scale"]
        self.rope_positions = max(m // p for m, p in zip(cfg["max_size"], self.patch_size))
        kw = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        cin = self.in_channels + (1 if self.concat_padding_mask else 0)
        self.patch_embed = PatchEmbed(self.patch_size, cin, dim, **kw)
        self.time_embed = CosmosTimeEmbedding(dim, rngs=rngs, param_dtype=param_dtype)
        self.transformer_blocks = nnx.List([
            CosmosTransformerBlock(dim, heads, head_dim, cfg["text_embed_dim"],
                                   int(dim * cfg["mlp_ratio"]), cfg["adaln_lora_dim"],
                                   attention_impl=attention_impl,
                                   context_parallel_impl=context_parallel_impl, **kw)
            for _ in range(cfg["num_layers"])])
        self.norm_out = AdaLayerNormLoRA(dim, cfg["adaln_lora_dim"], 2, rngs=rngs,
                                         param_dtype=param_dtype)
        self.proj_out = Linear(dim, self.out_channels * math.prod(self.patch_size), bias=False,
                               axes=("embed", None), **kw)
        # nn.Sequential(Linear, GELU) in diffusers: the Linear is "crossattn_proj.0"
        self.crossattn_proj = nnx.List([
            Linear(cfg["crossattn_proj_in_channels"], cfg["encoder_hidden_states_channels"],
                   axes=(None, "embed"), **kw)]) if cfg["use_crossattn_projection"] else None

    @property
    def config(self) -> dict:
        return dict(self._config_items)

    def _input(self, hidden_states, condition_mask, padding_mask):
        """cat([latent, condition mask, padding mask resized and repeated over T]) in the
        compute dtype, checked against in_channels."""
        x = jnp.asarray(hidden_states).astype(self.dtype)
        b, c, t, h, w = x.shape
        parts = [x]
        if condition_mask is not None:
            cond = jnp.asarray(condition_mask).astype(self.dtype)
            if cond.shape != (b, 1, t, h, w):
                raise ValueError(f"condition_mask must have shape [B, 1, T, H, W] = "
                                 f"{(b, 1, t, h, w)}, got {cond.shape}")
            parts.append(cond)
        if c + len(parts) - 1 != self.in_channels:
            raise ValueError(f"hidden_states ({c} channels) and condition_mask "
                             f"({len(parts) - 1}) give {c + len(parts) - 1} channels; the model "
                             f"takes in_channels={self.in_channels} (latent + condition mask)")
        if self.concat_padding_mask:
            # diffusers requires it; every pipeline passes zeros (no padding), the default here
            pad = (jnp.zeros((1, 1, h, w), self.dtype) if padding_mask is None
                   else resize_nearest(jnp.asarray(padding_mask).astype(self.dtype), h, w))
            if pad.ndim != 4 or pad.shape[1] != 1 or pad.shape[0] not in (1, b):
                raise ValueError(f"padding_mask must have shape [1 or B, 1, H, W], got "
                                 f"{tuple(jnp.shape(padding_mask))}")
            parts.append(jnp.broadcast_to(pad[:, :, None], (b, 1, t, h, w)))
        return jnp.concatenate(parts, axis=1)

    @traced_with_norm_checkpoints
    def __call__(self, hidden_states, timestep, encoder_hidden_states, *,
                 condition_mask=None, padding_mask=None, fps=None, attention_mask=None,
                 block_controlnet_hidden_states=None):
        """(B, C, T, H, W) latents, timestep sigma in [0, 1] as (B,) or per frame
        (B, 1, T, 1, 1), (B, L, text) context (crossattn_proj_in_channels wide when the model
        projects it, else text_embed_dim), condition_mask (B, 1, T, H, W), padding_mask
        (1 or B, 1, h, w) (None: zeros) -> (B, out_channels, T, H, W) velocity in the
        compute dtype. fps: None (all pipelines) or a Python number scaling frame positions."""
        if attention_mask is not None:
            raise ValueError("attention_mask is not supported: the Cosmos pipelines attend to "
                             "every text token (they pass none)")
        if block_controlnet_hidden_states is not None:
            raise ValueError("block_controlnet_hidden_states (Cosmos-Transfer) is not supported")
        if fps is not None and not isinstance(fps, numbers.Real):
            raise ValueError(f"fps must be None or a Python number (it shapes the RoPE tables), "
                             f"got {type(fps).__name__}")
        x = self._input(hidden_states, condition_mask, padding_mask)
        b, t_in = x.shape[0], x.shape[2]
        x, grid = self.patch_embed(x)
        x = mesh.constrain(x, TOKEN_AXES)
        cos, sin = rope_tables(self.head_dim, grid, self.rope_positions, self.rope_scale, fps)
        rope = (jnp.asarray(cos), jnp.asarray(sin))
        t, frames = _timesteps(timestep, b, t_in, self.patch_size[0])
        temb, e = self.time_embed(t)
        temb, e = temb.reshape(b, frames, -1), e.reshape(b, frames, -1)
        context = jnp.asarray(encoder_hidden_states).astype(self.dtype)
        if self.crossattn_proj is not None:
            context = jax.nn.gelu(self.crossattn_proj[0](context), approximate=False)
        context = mesh.constrain(context, TOKEN_AXES)
        x = run_blocks(
            self.transformer_blocks, x,
            lambda block, x: mesh.constrain(block(x, context, e, temb, rope), TOKEN_AXES),
            remat=self.remat, scan_layers=self.scan_layers)
        x, _ = self.norm_out(x, e, temb, self.dtype)
        x = self.proj_out(x)
        # proj_out's vectors are ordered (ph, pw, pt, C): not the patchify order (diffusers:
        # "not the inverse ... but this is correct")
        (f, h, w), (pt, ph, pw) = grid, self.patch_size
        x = x.reshape(b, f, h, w, ph, pw, pt, self.out_channels)
        x = jnp.einsum("bfhwpqtc->bcfthpwq", x)
        return x.reshape(b, self.out_channels, f * pt, h * ph, w * pw)
