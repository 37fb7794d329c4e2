"""SD3-family MMDiT (diffusers `SD3Transformer2DModel`) in Flax NNX.

Built from the diffusers config.json dict; covers SD3-Medium (plain), SD3.5-Large
(`qk_norm="rms_norm"`) and SD3.5-Medium MMDiT-X (`dual_attention_layers` + qk norm).
IP-adapter, ControlNet residuals and `skip_layers` of the diffusers forward are not implemented.
"""
from __future__ import annotations

import warnings

import jax.numpy as jnp
from flax import nnx

from wfm_jax.core import mesh
from wfm_jax.models.layers.attention import check_attention_impl
from wfm_jax.models.layers.embeddings import CombinedTimestepTextProjEmbeddings, PatchEmbed
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import traced_with_norm_checkpoints
from wfm_jax.models.layers.remat import REMAT_POLICIES, block_groups, call_block, check_remat, run_blocks  # noqa: F401 (re-exported)
from wfm_jax.models.sd3.blocks import AdaLayerNormContinuous, JointTransformerBlock

# diffusers SD3Transformer2DModel.__init__ defaults
DEFAULTS = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=18, attention_head_dim=64,
                num_attention_heads=18, joint_attention_dim=4096, caption_projection_dim=1152,
                pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=96,
                dual_attention_layers=(), qk_norm=None)

TOKEN_AXES = ("act_batch", "act_seq", "act_embed")


def sd3_config(config: dict) -> dict:
    """diffusers config.json dict -> complete SD3 config (defaults filled in).

    Like diffusers, unknown keys are ignored with a warning (naming them), so a hub config with a
    stray key still loads.
    """
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        warnings.warn(f"SD3Transformer2DModel config: ignoring unknown keys {unknown}", stacklevel=2)
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if k in DEFAULTS}}
    if cfg["out_channels"] is None:
        cfg["out_channels"] = cfg["in_channels"]
    cfg["dual_attention_layers"] = tuple(cfg["dual_attention_layers"] or ())
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    if cfg["caption_projection_dim"] != inner:
        # diffusers builds it anyway, but its joint attention then fails on the first call
        raise ValueError(f"caption_projection_dim={cfg['caption_projection_dim']} must equal "
                         f"num_attention_heads * attention_head_dim = {inner}")
    return cfg


class SD3Transformer(nnx.Module):
    """MMDiT velocity model; call layout and meaning identical to the diffusers forward.

    dtype: compute dtype (None: same as param_dtype); param_dtype: master weight dtype.
    attention_impl: "xla", "cudnn" (GPU, bf16/fp16 compute), "auto" (cuDNN where it applies, else
    XLA: layers.attention.resolve_attention_impl) or None (JAX's default: XLA).
    context_parallel_impl: "auto" | "ulysses" | "ring", the scheme when a mesh splits the tokens
    over `context` (layers.context_parallel).
    remat: a layers.remat.REMAT_POLICIES name, per transformer block.
    scan_layers: run each stretch of identical blocks as one lax.scan (block_groups); False
    unrolls them (the parameters are the same either way: one module per block).
    The output is in the compute dtype (as diffusers returns the model dtype). Parameter paths
    are diffusers module names ("transformer_blocks.3.attn.to_q.kernel"); `pos_embed.pos_embed`
    is a `Buffer` (a persistent buffer in diffusers: loaded and saved, never trained).
    """

    def __init__(self, config: dict, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 attention_impl="xla", remat: str = "everything_saveable", scan_layers: bool = True,
                 context_parallel_impl="auto", norm_checkpoints: bool = True):
        cfg = sd3_config(config)
        self._config_items = tuple(sorted(cfg.items()))  # hashable: part of the static graph
        self.dtype = jnp.dtype(dtype or param_dtype)
        check_attention_impl(attention_impl, self.dtype)
        remat = check_remat(remat)  # the JAX policy name (short aliases accepted)
        self.remat = remat
        self.scan_layers = bool(scan_layers)
        self.norm_checkpoints = bool(norm_checkpoints)  # layers/norms.py
        self.patch_size = cfg["patch_size"]
        self.out_channels = cfg["out_channels"]
        dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        self.inner_dim = dim
        kw = dict(rngs=rngs, dtype=self.dtype, param_dtype=param_dtype)

        self.pos_embed = PatchEmbed(sample_size=cfg["sample_size"], patch_size=self.patch_size,
                                    in_channels=cfg["in_channels"], embed_dim=dim,
                                    pos_embed_max_size=cfg["pos_embed_max_size"], **kw)
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(
            dim, cfg["pooled_projection_dim"], rngs=rngs, param_dtype=param_dtype)
        self.context_embedder = Linear(cfg["joint_attention_dim"], cfg["caption_projection_dim"],
                                       axes=(None, "embed"), **kw)
        n = cfg["num_layers"]
        self.transformer_blocks = nnx.List([
            JointTransformerBlock(dim, cfg["num_attention_heads"], cfg["attention_head_dim"],
                                  context_pre_only=i == n - 1, qk_norm=cfg["qk_norm"],
                                  use_dual_attention=i in cfg["dual_attention_layers"],
                                  attention_impl=attention_impl,
                                  context_parallel_impl=context_parallel_impl, **kw)
            for i in range(n)])
        self.norm_out = AdaLayerNormContinuous(dim, rngs=rngs, param_dtype=param_dtype)
        self.proj_out = Linear(dim, self.patch_size ** 2 * self.out_channels, axes=("embed", None),
                               **kw)

    @property
    def config(self) -> dict:
        return dict(self._config_items)

    def block_groups(self) -> list[list[int]]:
        """Runs of identical blocks (SD3.5-M: the dual-attention blocks 0..12, the plain ones,
        the context_pre_only last block): each run of two or more is one lax.scan."""
        return block_groups(self.transformer_blocks, self.scan_layers)

    def _run_blocks(self, x, c, temb):
        def apply(block, carry):
            c, x = block(carry[0], carry[1], temb)
            return mesh.constrain(x, TOKEN_AXES), None if c is None else mesh.constrain(
                c, TOKEN_AXES)

        return run_blocks(self.transformer_blocks, (x, c), apply, remat=self.remat,
                          scan_layers=self.scan_layers)

    @traced_with_norm_checkpoints
    def __call__(self, hidden_states, encoder_hidden_states, pooled_projections, timestep):
        """(B,C,H,W) latents, (B,L,joint_dim) text, (B,pooled_dim), (B,) float t -> (B,C_out,H,W)."""
        b, _, height, width = hidden_states.shape
        p = self.patch_size
        x = jnp.transpose(hidden_states, (0, 2, 3, 1)).astype(self.dtype)  # NCHW -> NHWC
        x = mesh.constrain(self.pos_embed(x), TOKEN_AXES)
        t = jnp.broadcast_to(jnp.asarray(timestep, jnp.float32).reshape(-1), (b,))
        temb = self.time_text_embed(t, pooled_projections)
        c = mesh.constrain(self.context_embedder(encoder_hidden_states), TOKEN_AXES)

        x, c = self._run_blocks(x, c, temb)

        x = self.proj_out(self.norm_out(x, temb))
        h, w = height // p, width // p
        x = x.reshape(b, h, w, p, p, self.out_channels)
        return jnp.einsum("nhwpqc->nchpwq", x).reshape(b, self.out_channels, h * p, w * p)
