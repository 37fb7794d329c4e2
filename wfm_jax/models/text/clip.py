"""CLIP text encoder with projection, as SD3 uses it (transformers' CLIPTextModelWithProjection).

SD3 reads two things from it: the hidden state before the last encoder layer (hidden_states[-2],
no final norm) and the projected embedding of the EOS token (text_embeds). Causal attention; the
optional padding mask removes keys as transformers' create_causal_mask does.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.core.mesh import constrain
from wfm_jax.models.layers.linear import Linear, param
from wfm_jax.models.layers.norms import LayerNorm
from wfm_jax.models.text.activations import activation

ACT_AXES = ("act_batch", "act_seq", "act_embed")


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
    """The fields of a transformers CLIPTextConfig that change the computation (its defaults)."""
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "CLIPTextConfig":
        """From a config.json dict; a CLIPConfig's nested text_config is accepted too."""
        config = config.get("text_config") or config
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names and v is not None})


class CLIPAttention(nnx.Module):
    def __init__(self, cfg: CLIPTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d = cfg.hidden_size
        if d % cfg.num_attention_heads:
            raise ValueError(f"hidden_size {d} is not divisible by num_attention_heads "
                             f"{cfg.num_attention_heads}")
        self.num_heads = cfg.num_attention_heads
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.q_proj = Linear(d, d, axes=("embed", "heads"), **kw)
        self.k_proj = Linear(d, d, axes=("embed", "heads"), **kw)
        self.v_proj = Linear(d, d, axes=("embed", "heads"), **kw)
        self.out_proj = Linear(d, d, axes=("heads", "embed"), **kw)

    def __call__(self, x: jax.Array, allowed: jax.Array) -> jax.Array:
        """x (B, S, D); allowed (B, 1, S, S) bool: which keys each query may see."""
        b, s, d = x.shape
        head_dim = d // self.num_heads
        split = lambda t: t.reshape(b, s, self.num_heads, head_dim)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * head_dim ** -0.5
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, d)
        return self.out_proj(out)


class CLIPMLP(nnx.Module):
    def __init__(self, cfg: CLIPTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.act = activation(cfg.hidden_act)
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, axes=("embed", "mlp"), **kw)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, axes=("mlp", "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nnx.Module):
    def __init__(self, cfg: CLIPTextConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        norm = dict(eps=cfg.layer_norm_eps, param_dtype=param_dtype)
        self.layer_norm1 = LayerNorm(cfg.hidden_size, **norm)
        self.self_attn = CLIPAttention(cfg, **kw)
        self.layer_norm2 = LayerNorm(cfg.hidden_size, **norm)
        self.mlp = CLIPMLP(cfg, **kw)

    def __call__(self, x: jax.Array, allowed: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.layer_norm1(x), allowed)
        x = x + self.mlp(self.layer_norm2(x))
        return constrain(x, ACT_AXES)


class CLIPTextEncoder(nnx.Module):
    """Port of transformers' CLIPTextModelWithProjection (text_model + text_projection)."""

    def __init__(self, cfg: CLIPTextConfig, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        self.cfg = cfg
        self.dtype = dtype
        d = cfg.hidden_size
        init = nnx.initializers.normal(0.02)
        self.token_embedding = param(init(rngs.params(), (cfg.vocab_size, d), param_dtype),
                                     ("vocab", "embed"))
        self.position_embedding = param(
            init(rngs.params(), (cfg.max_position_embeddings, d), param_dtype), (None, "embed"))
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([CLIPEncoderLayer(cfg, **kw) for _ in range(cfg.num_hidden_layers)])
        self.final_layer_norm = LayerNorm(d, eps=cfg.layer_norm_eps, param_dtype=param_dtype)
        self.text_projection = Linear(d, cfg.projection_dim, bias=False, axes=("embed", None), **kw)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                 output_hidden_states: bool = False) -> dict[str, jax.Array]:
        """input_ids (B, S) int; attention_mask (B, S) (1 = token, 0 = padding) or None.

        Returns last_hidden_state (final norm applied), penultimate (hidden_states[-2]: the
        input of the last layer, no final norm) and text_embeds (B, projection_dim); with
        output_hidden_states also the tuple hidden_states (embeddings, then every layer), for
        clip_skip.
        """
        b, s = input_ids.shape
        if s > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence length {s} exceeds max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}")
        dtype = self.dtype or self.token_embedding[...].dtype
        x = (jnp.take(self.token_embedding[...], input_ids, axis=0)
             + self.position_embedding[...][:s][None]).astype(dtype)
        x = constrain(x, ACT_AXES)

        allowed = jnp.tril(jnp.ones((s, s), bool))[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask.astype(bool)[:, None, None, :]
        hidden_states = [x]
        for layer in self.layers:
            x = layer(x, allowed)
            hidden_states.append(x)
        last = self.final_layer_norm(x)

        pooled = last[jnp.arange(b), self.eos_positions(input_ids)]
        out: dict[str, Any] = dict(last_hidden_state=last, penultimate=hidden_states[-2],
                   text_embeds=self.text_projection(pooled))
        if output_hidden_states:
            out["hidden_states"] = tuple(hidden_states)
        return out

    def eos_positions(self, input_ids: jax.Array) -> jax.Array:
        """Where transformers pools: configs with the legacy eos_token_id 2 take the largest id
        (the EOS token of the original vocab); others the first eos_token_id (0 if absent)."""
        if self.cfg.eos_token_id == 2:
            return jnp.argmax(input_ids.astype(jnp.int32), axis=-1)
        return jnp.argmax((input_ids == self.cfg.eos_token_id).astype(jnp.int32), axis=-1)


def make_model(config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs) -> CLIPTextEncoder:
    return CLIPTextEncoder(CLIPTextConfig.from_dict(config), rngs=rngs, dtype=dtype,
                           param_dtype=param_dtype)
