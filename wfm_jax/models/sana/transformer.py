"""SANA1.5 DiT (diffusers `SanaTransformer2DModel`) in Flax NNX, and the part it shares with
SANA-Video (`SanaBase`: timestep/caption embeddings, the blocks, the modulated final norm).

Built from the diffusers config.json dict and called with the diffusers forward's keyword
arguments (`hidden_states`, `encoder_hidden_states`, `timestep`, `guidance`,
`encoder_attention_mask`). The text mask goes in `encoder_attention_mask`; diffusers' self-
attention `attention_mask` is ignored by linear attention, so passing one is refused rather than
silently dropped (cosmos-rl's NFT passes its text mask there and trains unmasked).
Precision: projections and the residual stream in the compute dtype; norms, the timestep path,
modulation, gated sums and the linear attention's state and normaliser in fp32.
Parameter paths are diffusers module names ("transformer_blocks.3.attn1.to_q.kernel").
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.layers.attention import check_context_parallel_impl
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.norms import LayerNorm, traced_with_norm_checkpoints
from wfm_jax.models.layers.remat import check_remat, run_blocks
from wfm_jax.models.sana.block import SanaBlock
from wfm_jax.models.sana.cross_attention import mask_bias
from wfm_jax.models.sana.embeddings import PatchEmbed2D, caption_layers, time_embedding

TOKEN_AXES = ("act_batch", "act_seq", "act_embed")
ATTENTION_IMPLS = ("auto", "xla", None)  # "auto" is XLA here: the masked cross-attention

# diffusers SanaTransformer2DModel.__init__ defaults
DEFAULTS = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
                cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5, dropout=0.0,
                attention_bias=False, sample_size=32, patch_size=1, norm_elementwise_affine=False,
                norm_eps=1e-6, interpolation_scale=None, guidance_embeds=False,
                guidance_embeds_scale=0.1, qk_norm=None, timestep_scale=1.0)
# SANA1.5 1.6B 1024px (diffusers convert_sana_to_diffusers.py "SanaMS1.5_1600M_P1_D20"; spec §1.3)
SANA15_1600M = dict(DEFAULTS, in_channels=32, out_channels=32, num_attention_heads=70,
                    attention_head_dim=32, num_layers=20, num_cross_attention_heads=20,
                    cross_attention_head_dim=112, cross_attention_dim=2240, caption_channels=2304,
                    mlp_ratio=2.5, sample_size=32, patch_size=1, qk_norm="rms_norm_across_heads")


def check_config(cfg: dict, name: str) -> dict:
    """Refuse, by name, what diffusers cannot run or this port does not cover."""
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    if cfg["qk_norm"] not in (None, "rms_norm_across_heads"):
        raise ValueError(f"{name} qk_norm={cfg['qk_norm']!r} is not supported; "
                         "None or 'rms_norm_across_heads' are")
    if cfg["cross_attention_dim"] != dim:  # diffusers projects the caption to dim first
        raise ValueError(f"{name} needs cross_attention_dim == num_attention_heads * "
                         f"attention_head_dim = {dim}, got {cfg['cross_attention_dim']}")
    if cfg["dropout"]:
        raise ValueError(f"{name} dropout={cfg['dropout']} is not supported (released models: 0)")
    return cfg


def complete_config(config: dict, defaults: dict, name: str) -> dict:
    """diffusers config.json dict -> complete config (defaults filled in, unknown keys warned)."""
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    unknown = sorted(set(cfg) - set(defaults))
    if unknown:
        warnings.warn(f"{name} config: ignoring unknown keys {unknown}", stacklevel=3)
    cfg = {**defaults, **{k: v for k, v in cfg.items() if k in defaults}}
    cfg["out_channels"] = cfg["out_channels"] or cfg["in_channels"]
    return check_config(cfg, name)


def sana_config(config: dict) -> dict:
    return complete_config(config, DEFAULTS, "SanaTransformer2DModel")


class SanaBase(nnx.Module):
    """What SANA1.5 and SANA-Video share; subclasses make the patch embedding and say how the
    tokens map back to latents. dtype: compute dtype (None: param_dtype); remat: a
    layers.remat.REMAT_POLICIES name, per block; scan_layers: the blocks as one lax.scan;
    attention_impl: accepted for the common loader interface, "auto" / "xla" / None (the only
    softmax attention is the masked cross-attention, run by XLA)."""

    video = False

    def __init__(self, cfg: dict, *, dtype, param_dtype, rngs: nnx.Rngs, attention_impl, remat,
                 scan_layers, norm_checkpoints: bool = True):
        if attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"SANA attention_impl must be one of {ATTENTION_IMPLS} (its masked "
                             f"cross-attention runs on XLA), got {attention_impl!r}")
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self._config_items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                          for k, v in cfg.items()))  # hashable: static graph
        self.dtype = jnp.dtype(dtype or param_dtype)
        self.remat, self.guidance_embeds = remat, cfg["guidance_embeds"]
        self.scan_layers = bool(scan_layers)
        self.norm_checkpoints = bool(norm_checkpoints)  # layers/norms.py
        self.out_channels = cfg["out_channels"]
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        kw = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)
        self.time_embed = time_embedding(dim, cfg["guidance_embeds"], rngs=rngs,
                                         param_dtype=param_dtype)
        self.caption_projection, self.caption_norm = caption_layers(cfg["caption_channels"], dim,
                                                                    **kw)
        self.transformer_blocks = nnx.List([SanaBlock(cfg, video=self.video, **kw)
                                            for _ in range(cfg["num_layers"])])
        self.norm_out = LayerNorm(dim, eps=1e-6, affine=False)  # SanaModulatedNorm's
        self.proj_out = Linear(dim, self.out_channels * self._patch_volume(cfg),
                               axes=("embed", None), **kw)
        init = jax.random.normal(rngs.params(), (2, dim), param_dtype) / math.sqrt(dim)
        self.scale_shift_table = param(init, (None, "embed"))

    @staticmethod
    def _patch_volume(cfg) -> int:
        p = cfg["patch_size"]
        return math.prod(p) if isinstance(p, (tuple, list)) else p * p

    @property
    def config(self) -> dict:
        return dict(self._config_items)

    def _timestep(self, timestep, guidance, batch: int, tokens: int):
        """-> tproj (B, T, 6, D), temb (B, T, D) fp32; T = 1 or (video) the token count."""
        if self.guidance_embeds and guidance is None:
            raise ValueError("this SANA model has guidance_embeds=True: pass guidance")
        if guidance is not None and not self.guidance_embeds:
            raise ValueError("guidance given, but this SANA model has no guidance embedding")
        t = jnp.asarray(timestep, jnp.float32)
        t = jnp.broadcast_to(t.reshape(-1), (batch,)) if t.ndim <= 1 else t
        per = t.size // batch
        if t.size % batch or (per != 1 and not (self.video and per == tokens)):
            what = "(B,) or (B, tokens)" if self.video else "(B,)"
            raise ValueError(f"timestep must be a scalar or {what}; got shape {tuple(t.shape)} "
                             f"for batch {batch} and {tokens} tokens")
        t = t.reshape(-1)
        g = None
        if guidance is not None:
            g = jnp.broadcast_to(jnp.asarray(guidance, jnp.float32).reshape(-1, 1),
                                 (batch, per)).reshape(-1)
        tproj, temb = self.time_embed(t, g)
        return tproj.reshape(batch, per, 6, -1), temb.reshape(batch, per, -1)

    @traced_with_norm_checkpoints
    def _run(self, x, grid, rope, encoder_hidden_states, timestep, guidance,
             encoder_attention_mask, attention_mask):
        """Shared forward from the patch tokens x (B, N, D) to the final projection."""
        if attention_mask is not None:
            raise ValueError("attention_mask (the self-attention mask) is ignored by SANA's "
                             "linear attention; pass the text mask as encoder_attention_mask")
        b, n = x.shape[:2]
        x = mesh.constrain(x, TOKEN_AXES)
        tproj, temb = self._timestep(timestep, guidance, b, n)
        context = self.caption_projection(jnp.asarray(encoder_hidden_states).astype(self.dtype))
        context = mesh.constrain(self.caption_norm(context), TOKEN_AXES)
        bias = mask_bias(encoder_attention_mask, b, context.shape[1])
        x = run_blocks(
            self.transformer_blocks, x,
            lambda block, x: mesh.constrain(block(x, context, bias, tproj, rope, grid=grid),
                                            TOKEN_AXES),
            remat=self.remat, scan_layers=self.scan_layers)
        mod = self.scale_shift_table[...].astype(jnp.float32) + temb[:, :, None]  # (B, T, 2, D)
        y = self.norm_out(x.astype(jnp.float32)) * (1.0 + mod[:, :, 1]) + mod[:, :, 0]
        return self.proj_out(y.astype(self.dtype))


class SanaTransformer(SanaBase):
    """SANA1.5 velocity model: (B, C, H, W) latents -> (B, C_out, H, W) in the compute dtype."""

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 attention_impl="xla", remat: str = "everything_saveable", context_parallel_impl="auto",
                 scan_layers: bool = False, norm_checkpoints: bool = True):
        # linear attention splits over `context` with one psum of its K.V state, never Ulysses or
        # a ring: the option is accepted (one recipe key for every family) and only checked
        check_context_parallel_impl(context_parallel_impl)
        cfg = sana_config(config)
        super().__init__(cfg, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                         attention_impl=attention_impl, remat=remat,
                         scan_layers=scan_layers, norm_checkpoints=norm_checkpoints)
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        self.patch_size = cfg["patch_size"]
        self.patch_embed = PatchEmbed2D(sample_size=cfg["sample_size"], patch_size=self.patch_size,
                                        in_channels=cfg["in_channels"], dim=dim,
                                        interpolation_scale=cfg["interpolation_scale"],
                                        rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)

    def __call__(self, hidden_states, encoder_hidden_states, timestep, guidance=None,
                 encoder_attention_mask=None, attention_mask=None):
        """hidden_states (B, C, H, W); encoder_hidden_states (B, L, caption_channels) (Gemma2
        states); timestep (B,) or scalar (the pipeline feeds int(1000 sigma) x timestep_scale);
        guidance (B,) when guidance_embeds; encoder_attention_mask (B, L) 1 = keep."""
        b = hidden_states.shape[0]
        x, (h, w) = self.patch_embed(jnp.asarray(hidden_states).astype(self.dtype))
        x = self._run(x, (h, w), None, encoder_hidden_states, timestep, guidance,
                      encoder_attention_mask, attention_mask)
        p = self.patch_size
        x = x.reshape(b, h, w, p, p, self.out_channels)
        return jnp.einsum("bhwpqc->bchpwq", x).reshape(b, self.out_channels, h * p, w * p)
