"""Qwen2.5-VL text tower (transformers' Qwen2_5_VLTextModel), as Cosmos-Predict2.5 encodes prompts
with Cosmos-Reason1-7B; the vision tower is not ported.

Text-only input makes the multimodal RoPE ("mrope") ordinary: transformers expands the 1-D
positions to three identical (t, h, w) streams and picks each `mrope_section` of frequencies from
one of them, so every section sees the same positions and the result is 1-D rotate-half RoPE.

`Qwen2_5_VLEncoder` is what a `Qwen2_5_VLForConditionalGeneration` checkpoint loads into: the text
tower plus the tensors it does not compute with (the vision tower, an untied lm_head) held as
`Passthrough` variables, so converting a released checkpoint and exporting it writes back exactly
the bytes that were read. Passthrough variables are not `nnx.Param`: optimisers, LoRA and
`flat_params` never see them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.text.activations import activation

ACT_AXES = ("act_batch", "act_seq", "act_embed")


class Passthrough(nnx.Variable):
    """A stored tensor the port carries unchanged (converted and exported, never computed with)."""


def _text_dict(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text part of a Qwen2_5_VLConfig dict: `text_config` when present (transformers >= 4.5x
    saves), else the top level (the released legacy layout), as transformers reads it."""
    return config.get("text_config") or config


@dataclasses.dataclass(frozen=True)
class QwenTextConfig:
    """The fields of a transformers Qwen2_5_VLTextConfig that change the computation (its
    defaults). rope_theta comes from rope_parameters / rope_scaling / rope_theta."""
    vocab_size: int = 152064
    hidden_size: int = 8192
    intermediate_size: int = 29568
    num_hidden_layers: int = 80
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "QwenTextConfig":
        text = _text_dict(config)
        names = {f.name for f in dataclasses.fields(cls)} - {"rope_theta", "tie_word_embeddings"}
        kw = {k: v for k, v in text.items() if k in names and v is not None}
        if "num_key_value_heads" in text and text["num_key_value_heads"] is None:  # as transformers
            kw["num_key_value_heads"] = kw.get("num_attention_heads", cls.num_attention_heads)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "mrope"):  # transformers maps "mrope" to "default"
            raise ValueError(f"unsupported Qwen2.5-VL rope_type {kind!r}; "
                             f"supported: default, mrope")
        kw["rope_theta"] = float(rope.get("rope_theta", text.get("rope_theta", 1e6)))
        layer_types = text.get("layer_types") or []
        if text.get("use_sliding_window") or "sliding_attention" in layer_types:
            raise ValueError("Qwen2.5-VL sliding-window attention is not supported "
                             "(use_sliding_window must be false)")
        kw["tie_word_embeddings"] = bool(config.get("tie_word_embeddings")
                                         or text.get("tie_word_embeddings"))
        cfg = cls(**kw)
        if cfg.hidden_size % cfg.num_attention_heads or (
                cfg.num_attention_heads % cfg.num_key_value_heads):
            raise ValueError(f"hidden_size {cfg.hidden_size}, num_attention_heads "
                             f"{cfg.num_attention_heads} and num_key_value_heads "
                             f"{cfg.num_key_value_heads} do not divide evenly")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(S, head_dim) fp32 cos and sin at positions 0..S-1, rotate-half layout (cat(f, f)).

    The inverse frequencies are built in float32 as transformers builds them."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    freqs = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class QwenRMSNorm(nnx.Module):
    """transformers' Qwen2_5_VLRMSNorm: normalise in fp32, cast back to the input dtype, then
    scale (so a bf16 model rounds where transformers does)."""

    def __init__(self, dim: int, *, eps: float, param_dtype):
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.eps)
        return h.astype(dtype) * self.scale[...].astype(dtype)


class QwenAttention(nnx.Module):
    """Causal GQA self-attention; q/k/v have biases, o has none."""

    def __init__(self, cfg: QwenTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                            cfg.num_key_value_heads, hd)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.q_proj = Linear(d, self.num_heads * hd, axes=("embed", "heads"), **kw)
        self.k_proj = Linear(d, self.num_kv_heads * hd, axes=("embed", "heads"), **kw)
        self.v_proj = Linear(d, self.num_kv_heads * hd, axes=("embed", "heads"), **kw)
        self.o_proj = Linear(self.num_heads * hd, d, bias=False, axes=("heads", "embed"), **kw)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 allowed: jax.Array) -> jax.Array:
        """x (B, S, D); cos/sin (S, head_dim) in x's dtype; allowed (B or 1, 1, S, S) bool."""
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        rot = lambda t: t * cos[:, None] + _rotate_half(t) * sin[:, None]
        q, k = rot(q), rot(k)
        # GQA: each kv head serves num_heads / num_kv_heads consecutive query heads
        q = q.reshape(b, s, self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim)
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32)
        scores = scores * self.head_dim ** -0.5
        scores = jnp.where(allowed[:, :, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(b, s, -1)
        return self.o_proj(out)


class QwenMLP(nnx.Module):
    """down(act(gate x) * up x), no biases (SwiGLU with the config's act, silu)."""

    def __init__(self, cfg: QwenTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, bias=False, dtype=dtype, param_dtype=param_dtype)
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.act = activation(cfg.hidden_act)
        self.gate_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.up_proj = Linear(d, f, axes=("embed", "mlp"), **kw)
        self.down_proj = Linear(f, d, axes=("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class QwenDecoderLayer(nnx.Module):
    def __init__(self, cfg: QwenTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        norm = dict(eps=cfg.rms_norm_eps, param_dtype=param_dtype)
        self.input_layernorm = QwenRMSNorm(cfg.hidden_size, **norm)
        self.self_attn = QwenAttention(cfg, **kw)
        self.post_attention_layernorm = QwenRMSNorm(cfg.hidden_size, **norm)
        self.mlp = QwenMLP(cfg, **kw)

    def __call__(self, x, cos, sin, allowed):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ACT_AXES)


class QwenTextModel(nnx.Module):
    """Port of transformers' Qwen2_5_VLTextModel for text-only input (positions 0..S-1)."""

    def __init__(self, cfg: QwenTextConfig, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        self.cfg = cfg
        self.dtype = dtype
        self.embed_tokens = param(nnx.initializers.normal(0.02)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size), param_dtype), ("vocab", "embed"))
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([QwenDecoderLayer(cfg, **kw) for _ in range(cfg.num_hidden_layers)])
        self.norm = QwenRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, param_dtype=param_dtype)

    def __call__(self, input_ids: jax.Array,
                 attention_mask: jax.Array | None = None) -> tuple[jax.Array, ...]:
        """input_ids (B, S) int; attention_mask (B, S) (1 = token, 0 = padding) or None (causal
        only: what diffusers' Cosmos pipeline passes).

        Returns transformers' `hidden_states`: the embeddings, the output of each layer but the
        last, then the last layer's output after the final norm (num_hidden_layers + 1 arrays).
        """
        s = input_ids.shape[1]
        dtype = self.dtype or self.embed_tokens[...].dtype
        x = constrain(jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(dtype), ACT_AXES)
        cos, sin = rope_tables(s, self.cfg.head_dim, self.cfg.rope_theta)
        cos_t, sin_t = jnp.asarray(cos).astype(dtype), jnp.asarray(sin).astype(dtype)
        allowed = jnp.tril(jnp.ones((s, s), bool))[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask.astype(bool)[:, None, None, :]
        hidden_states = [x]
        for layer in self.layers:
            x = layer(x, cos_t, sin_t, allowed)
            hidden_states.append(x)
        hidden_states[-1] = self.norm(x)
        return tuple(hidden_states)


# ----------------------------------------------------------------------------- the checkpoint

def _vision_dict(config: Mapping[str, Any]) -> dict:
    """transformers' Qwen2_5_VLVisionConfig defaults, overridden by config["vision_config"]."""
    out = dict(depth=32, hidden_size=3584, intermediate_size=3420, in_channels=3, patch_size=14,
               spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584)
    out.update({k: v for k, v in (config.get("vision_config") or {}).items()
                if k in out and v is not None})
    return out


def passthrough_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """checkpoint key -> shape of every tensor a Qwen2_5_VLForConditionalGeneration checkpoint
    stores besides the text tower: the vision tower (`visual.*`) and, unless the embeddings are
    tied, `lm_head.weight` (save_pretrained writes no lm_head when tied)."""
    v = _vision_dict(config)
    h, f, m = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"]
    shapes: dict[str, tuple[int, ...]] = {"visual.patch_embed.proj.weight": (h, v["in_channels"], v["temporal_patch_size"],
                                                 v["patch_size"], v["patch_size"])}
    for i in range(v["depth"]):
        p = f"visual.blocks.{i}"
        shapes.update({f"{p}.norm1.weight": (h,), f"{p}.norm2.weight": (h,),
                       f"{p}.attn.qkv.weight": (3 * h, h), f"{p}.attn.qkv.bias": (3 * h,),
                       f"{p}.attn.proj.weight": (h, h), f"{p}.attn.proj.bias": (h,)})
        for proj, shape in (("gate_proj", (f, h)), ("up_proj", (f, h)), ("down_proj", (h, f))):
            shapes[f"{p}.mlp.{proj}.weight"] = shape
            shapes[f"{p}.mlp.{proj}.bias"] = shape[:1]
    merged = h * m * m
    shapes.update({"visual.merger.ln_q.weight": (h,),
                   "visual.merger.mlp.0.weight": (merged, merged),
                   "visual.merger.mlp.0.bias": (merged,),
                   "visual.merger.mlp.2.weight": (v["out_hidden_size"], merged),
                   "visual.merger.mlp.2.bias": (v["out_hidden_size"],)})
    text = QwenTextConfig.from_dict(config)
    if not text.tie_word_embeddings:
        shapes["lm_head.weight"] = (text.vocab_size, text.hidden_size)
    return shapes


def _nested(flat: Mapping[str, nnx.Variable]) -> nnx.Dict:
    """{"a.0.w": v} -> Dict(a=Dict({"0": Dict(w=v)})): state paths spell the checkpoint keys."""
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    def wrap(node: dict) -> nnx.Dict:
        return nnx.Dict({k: wrap(v) if isinstance(v, dict) else v for k, v in node.items()})

    return wrap(tree)


class Qwen2_5_VLEncoder(nnx.Module):
    """A Qwen2_5_VLForConditionalGeneration checkpoint: `language_model` computes; `passthrough`
    holds the rest under its checkpoint keys (e.g. passthrough.visual.blocks.0.attn.qkv.weight)."""

    def __init__(self, config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        self.language_model = QwenTextModel(QwenTextConfig.from_dict(config), rngs=rngs,
                                            dtype=dtype, param_dtype=param_dtype)
        axes = lambda key, shape: (("vocab", "embed") if key == "lm_head.weight"
                                   else (None,) * len(shape))  # the vision tower: replicated
        self.passthrough = _nested({
            key: param(jnp.zeros(shape, param_dtype), axes(key, shape), Passthrough)
            for key, shape in passthrough_shapes(config).items()})

    def __call__(self, input_ids: jax.Array,
                 attention_mask: jax.Array | None = None) -> tuple[jax.Array, ...]:
        return self.language_model(input_ids, attention_mask)


def make_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs) -> Qwen2_5_VLEncoder:
    return Qwen2_5_VLEncoder(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def make_text_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
                    rngs: nnx.Rngs) -> QwenTextModel:
    """The text tower alone (no passthrough tensors): for loaders that skip the vision keys."""
    return QwenTextModel(QwenTextConfig.from_dict(config), rngs=rngs, dtype=dtype,
                         param_dtype=param_dtype)


__all__ = ["Passthrough", "QwenTextConfig", "QwenTextModel", "Qwen2_5_VLEncoder", "make_model",
           "make_text_model", "passthrough_shapes", "rope_tables"]
