"""The SD3 text-to-image pipeline in JAX: the "sd3" model family (wfm_jax.families.FAMILIES).

`SD3Pipeline` holds the NNX components of a diffusers `StableDiffusion3Pipeline` directory and
implements `PipelineFamily`: conditioning {"prompt_embeds", "pooled_projections"} exactly as
diffusers' encode_prompt computes it, the MMDiT velocity (diffusers layout), the VAE with the
config's shift and scaling. It knows nothing of training.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters.loading import load_model
from wfm_jax.families import base as fam
from wfm_jax.families.base import PipelineError, PipelineFamily
from wfm_jax.families.sd3 import LORA_TARGETS
from wfm_jax.models.options import ModelOptions
from wfm_jax.models.vae.autoencoder_kl import scale_latents, unscale_latents, vae_scale_factor

PIPELINE_CLASS = "StableDiffusion3Pipeline"
COND_KEYS = ("prompt_embeds", "pooled_projections")
RELEASED_CLIP_LENGTH = 77  # the CLIP tokenizers of every released SD3 / SD3.5 pipeline
_TEXT = ("text_encoder", "text_encoder_2", "text_encoder_3")
_TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3")

__all__ = [
    "PIPELINE_CLASS",
    "PipelineError",
    "SD3Pipeline",
    "decode_latents",
    "encode_tokens",
    "read_model_index",
]


def read_model_index(directory: str) -> dict:
    """model_index.json of an SD3 pipeline dir; PipelineError for any other class."""
    info = fam.read_model_index(directory)
    found = info.get("_class_name")
    if found != PIPELINE_CLASS:
        raise PipelineError(f"{directory} holds a {found!r}, not a {PIPELINE_CLASS}")
    return info


def _load_tokenizer(directory: str, name: str, entry):
    import transformers
    cls = getattr(transformers, entry[1])
    return cls.from_pretrained(os.path.join(directory, name))


@dataclasses.dataclass(eq=False)
class SD3Pipeline(PipelineFamily):
    pipeline_class = PIPELINE_CLASS
    family = "sd3"
    lora_targets = LORA_TARGETS
    display_name = "SD3"
    # generate's defaults: diffusers' SD3.5 pipeline (28 Euler steps, guidance 4.5 in the docs)
    default_solver = "euler"
    default_steps = 28
    default_guidance = 4.5
    tiny_writer = "wfm_jax.families.tiny:write_pipeline"

    directory: str
    transformer: Any
    vae: Any
    text_encoders: tuple  # CLIP-L, CLIP-G, T5 (T5 may be None, as diffusers allows)
    tokenizers: tuple
    transformer_config: dict
    vae_config: dict
    scheduler_config: dict

    # ---------------------------------------------------------------- construction
    @classmethod
    def load(cls, directory: str, *, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
             text_dtype=None, frozen_param_dtype=None,
             options: ModelOptions | None = None) -> SD3Pipeline:
        """Load every component of a local diffusers SD3 pipeline dir straight onto `mesh`.
        options (a ModelOptions) go to the transformer's constructor (attention_impl, remat).
        frozen_param_dtype (default param_dtype): the weights of the VAE and text encoders,
        which training never updates: the compute dtype there, not fp32 master copies (T5-XXL
        alone is 19 GB in fp32)."""
        info = read_model_index(directory)
        for name in ("transformer", "vae", "scheduler", "text_encoder", "text_encoder_2",
                     "tokenizer", "tokenizer_2"):
            if not fam.component_present(info, directory, name):
                raise PipelineError(f"pipeline {directory} lacks its {name!r} component")
        kw = dict(param_dtype=param_dtype, mesh=mesh, rules=rules)
        transformer, t_cfg = load_model(directory, component="transformer", dtype=dtype, **kw,
                                        **(options.constructor_kwargs() if options else {}))
        frozen = dict(kw, param_dtype=frozen_param_dtype or param_dtype)
        vae, v_cfg = load_model(directory, component="vae", dtype=None, **frozen)
        encoders, tokenizers = [], []
        for enc, tok in zip(_TEXT, _TOKENIZERS):
            if fam.component_present(info, directory, enc):
                encoders.append(load_model(directory, component=enc, dtype=text_dtype,
                                           **frozen)[0])
                tokenizers.append(_load_tokenizer(directory, tok, info[tok]))
            else:
                encoders.append(None)
                tokenizers.append(None)
        with open(os.path.join(directory, "scheduler", "scheduler_config.json")) as f:
            s_cfg = json.load(f)
        return cls(directory, transformer, vae, tuple(encoders), tuple(tokenizers), t_cfg, v_cfg,
                   s_cfg)

    # ---------------------------------------------------------------- depth
    @classmethod
    def block_kinds(cls, config: Mapping[str, Any]) -> list[str]:
        """"joint" blocks, "+dual" with SD3.5's second, image-only attention
        (dual_attention_layers), and the "last" one (context_pre_only: no text output)."""
        n, dual = int(config["num_layers"]), set(config.get("dual_attention_layers") or ())
        return [("last" if i == n - 1 else "joint") + ("+dual" if i in dual else "")
                for i in range(n)]

    @classmethod
    def with_blocks(cls, config: Mapping[str, Any], kinds: Sequence[str]) -> dict:
        """num_layers and dual_attention_layers for `kinds`; the last block is always the
        context_pre_only one, so "last" (or "last+dual") must end the list and only end it."""
        known = {"joint", "joint+dual", "last", "last+dual"}
        if (not kinds or set(kinds) - known or not kinds[-1].startswith("last")
                or any(k.startswith("last") for k in kinds[:-1])):
            raise PipelineError(f"SD3 blocks {list(kinds)}: kinds of {sorted(known)}, "
                                f"one 'last' block, at the end")
        return {**config, "num_layers": len(kinds),
                "dual_attention_layers": [i for i, k in enumerate(kinds) if k.endswith("+dual")]}

    # ---------------------------------------------------------------- geometry
    @property
    def shift(self) -> float:
        return float(self.scheduler_config.get("shift", 3.0))

    @property
    def latent_channels(self) -> int:
        return int(self.transformer_config["in_channels"])

    @property
    def spatial_factor(self) -> int:
        return vae_scale_factor(self.vae_config)

    def cond_shapes(self, batch: int, text_len: int) -> dict[str, tuple[int, ...]]:
        t = self.transformer_config  # CLIP's tokens joined to T5's
        return {"prompt_embeds": (batch, self.clip_length() + text_len, t["joint_attention_dim"]),
                "pooled_projections": (batch, t["pooled_projection_dim"])}

    def clip_length(self) -> int:
        """Tokens of the CLIP part of prompt_embeds: what `tokenize` pads CLIP prompts to (the
        CLIP tokenizer's model_max_length; the shapes world's pipeline keeps 16), else the
        released SD3's 77 where no tokenizer is loaded."""
        tok = self.tokenizers[0] if self.tokenizers else None
        return int(tok.model_max_length) if tok is not None else RELEASED_CLIP_LENGTH

    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, int, int, int]:
        """(B, C, h, w) in diffusers layout; height/width must divide by VAE x patch factor.
        frames is ignored (an image family)."""
        multiple = self.spatial_factor * int(self.transformer_config["patch_size"])
        if height % multiple or width % multiple:
            raise ValueError(f"height {height} and width {width} must be multiples of {multiple} "
                             f"(VAE factor {self.spatial_factor} x patch size "
                             f"{self.transformer_config['patch_size']})")
        # the position table covers a (max x max) patch grid: larger fails deep inside the model
        most = self.transformer_config.get("pos_embed_max_size")
        if most and max(height, width) > int(most) * multiple:
            raise ValueError(f"{height}x{width} is larger than this model takes: its position "
                             f"embedding covers {most}x{most} patches, at most "
                             f"{int(most) * multiple}x{int(most) * multiple} pixels (patch size "
                             f"{self.transformer_config['patch_size']} x VAE factor "
                             f"{self.spatial_factor})")
        return (batch, self.latent_channels, height // self.spatial_factor,
                width // self.spatial_factor)

    # ---------------------------------------------------------------- text
    def tokenize(self, prompts: Sequence[str], max_sequence_length: int = 256) -> dict:
        """Token ids for the three encoders, padded like diffusers (numpy int32)."""
        out = {}
        for i, tok in enumerate(self.tokenizers):
            if tok is None:
                continue
            length = max_sequence_length if i == 2 else self.tokenizers[0].model_max_length
            ids = tok(list(prompts), padding="max_length", max_length=length, truncation=True,
                      add_special_tokens=True, return_tensors="np").input_ids
            out[_TEXT[i]] = ids.astype(np.int32)
        return out

    def encode_text_with(self, text_encoders, ids: Mapping[str, Any],
                         max_sequence_length: int = 256) -> dict:
        embeds, pooled = encode_tokens(text_encoders, ids,
                                       int(self.transformer_config["joint_attention_dim"]),
                                       max_sequence_length)
        return {"prompt_embeds": embeds, "pooled_projections": pooled}

    def encode_tokens(self, ids: dict, max_sequence_length: int = 256):
        """(prompt_embeds, pooled) of host ids (the pre-family API)."""
        return encode_tokens(self.text_encoders, ids,
                             int(self.transformer_config["joint_attention_dim"]),
                             max_sequence_length)

    def encode_prompt(self, prompts: Sequence[str], max_sequence_length: int = 256) -> dict:
        return super().encode_prompt(prompts, max_sequence_length)

    def cond_from_embedding(self, embedding) -> dict:
        if not isinstance(embedding, Mapping) or not set(COND_KEYS) <= set(embedding):
            raise ValueError("precomputed text embeddings for SD3 must hold 'prompt_embeds' "
                             "and 'pooled_projections'")
        return {k: np.asarray(embedding[k], np.float32) for k in COND_KEYS}

    # ---------------------------------------------------------------- denoiser and VAE
    def velocity_with(self, transformer, latents, timesteps, cond: Mapping) -> jax.Array:
        """MMDiT velocity for diffusers-layout latents (B, C, h, w); timesteps = 1000 sigma."""
        return transformer(latents, cond["prompt_embeds"], cond["pooled_projections"],
                           timesteps)

    def posterior_with(self, vae, pixels):
        """Pixels (B, H, W, 3) in [-1, 1] -> the posterior's (mean, std), (B, C, h, w)."""
        dist = vae.encode(jnp.transpose(pixels, (0, 3, 1, 2)))
        return dist.mean, dist.std

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        return scale_latents(z, self.vae_config)

    def decode_with(self, vae, latents) -> jax.Array:
        """Latents (B, C, h, w) -> pixels (B, H, W, 3) in [0, 1], as output_type="np"."""
        return decode_latents(vae, self.vae_config, latents)


def encode_tokens(encoders, ids: dict, joint_attention_dim: int, max_sequence_length: int = 256):
    """(prompt_embeds (B, 77 + L, D_joint), pooled (B, P)) exactly as diffusers' encode_prompt:
    CLIP-L and CLIP-G penultimate states concatenated on features and zero-padded to the T5
    width, then concatenated with T5's states on the sequence; pooled = both projections."""
    clip_embeds, pooled = [], []
    for name, enc in zip(_TEXT[:2], encoders[:2]):
        out = enc(jnp.asarray(ids[name]))  # diffusers passes no attention mask to CLIP
        clip_embeds.append(out["penultimate"].astype(jnp.float32))
        pooled.append(out["text_embeds"].astype(jnp.float32))
    clip = jnp.concatenate(clip_embeds, axis=-1)
    if encoders[2] is None:  # diffusers' zeros when the pipeline has no T5
        t5 = jnp.zeros((clip.shape[0], max_sequence_length, joint_attention_dim), jnp.float32)
    else:  # nor to T5
        t5 = encoders[2](jnp.asarray(ids[_TEXT[2]])).astype(jnp.float32)
    clip = jnp.pad(clip, ((0, 0), (0, 0), (0, t5.shape[-1] - clip.shape[-1])))
    return jnp.concatenate([clip, t5], axis=-2), jnp.concatenate(pooled, axis=-1)


def decode_latents(vae, vae_config: dict, latents: jax.Array) -> jax.Array:
    """Scaled latents (B, C, h, w) -> pixels (B, H, W, 3) in [0, 1] (diffusers postprocess)."""
    image = vae.decode(unscale_latents(latents.astype(jnp.float32), vae_config))
    image = jnp.clip(image.astype(jnp.float32) / 2 + 0.5, 0.0, 1.0)
    return jnp.transpose(image, (0, 2, 3, 1))
