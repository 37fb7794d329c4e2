"""Wan2.1 text-to-video (diffusers `WanPipeline`) as a model family.

Components: WanTransformer3DModel (transformer.py), AutoencoderKLWan (vae.py, run in fp32 as
diffusers' Wan pipelines do), UMT5EncoderModel (models/text/t5.py) and its tokenizer; the
scheduler is UniPC with flow sigmas (sampling/unipc.py), whose config gives the shift.

What differs from SD3, each exactly as diffusers' `pipelines/wan/pipeline_wan.py` computes it:
- text: one UMT5, run with the attention mask; each row is cut to its prompt's true length and
  zero-padded back to max_sequence_length (the transformer attends to those zero rows);
- latents: (B, z_dim, (T-1)/4+1, H/8, W/8); normalised per channel with latents_mean/std;
- timesteps: the transformer takes 1000 sigma as is (UniPC feeds int64-truncated values);
- decode: inverse normalisation, the chunked VAE decode, then VideoProcessor's postprocess.
Wan2.2 variants (transformer_2 / boundary_ratio, expand_timesteps) are refused by name.
"""
from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters.loading import load_model, read_json
from wfm_jax.families.base import PipelineError, PipelineFamily, component_present, read_model_index
from wfm_jax.families.wan import LORA_TARGETS
from wfm_jax.models.options import ModelOptions
from wfm_jax.models.wan.vae import as_config
from wfm_jax.models.wan.video_latents import WanVideoLatents

DEFAULT_MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default
_REQUIRED = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
COND_KEY = "encoder_hidden_states"


def prompt_clean(text: str) -> str:
    """diffusers' Wan prompt_clean: ftfy.fix_text when ftfy is installed (diffusers skips it
    otherwise, and so do we), html-unescape twice, collapse whitespace (the `regex` module's
    Unicode \\s, as diffusers uses), strip."""
    try:
        import ftfy
        text = ftfy.fix_text(text)
    except ModuleNotFoundError:
        pass
    import regex
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


def _load_tokenizer(directory: str, entry):
    import transformers
    cls = getattr(transformers, entry[1], None) if entry and entry[1] else None
    return (cls or transformers.AutoTokenizer).from_pretrained(os.path.join(directory,
                                                                            "tokenizer"))


def _refuse_wan22(info: Mapping, directory: str) -> None:
    used = [name for name in ("transformer_2",) if component_present(info, directory, name)]
    used += [f"{k}={info[k]}" for k in ("boundary_ratio", "expand_timesteps") if info.get(k)]
    if used:
        raise PipelineError(f"{directory}: WanPipeline with {', '.join(used)} (Wan2.2) is not "
                            f"supported; only Wan2.1 text-to-video is")


class WanPipeline(WanVideoLatents, PipelineFamily):
    pipeline_class = "WanPipeline"
    family = "wan"
    lora_targets = LORA_TARGETS
    display_name = "Wan"
    is_video = True
    default_solver = "unipc"  # Wan's scheduler (UniPC, flow sigmas, order 2, bh2)
    # WanPipeline.__call__'s defaults (generate uses them when the user names none)
    default_steps, default_guidance, default_frames, default_fps = 50, 5.0, 81, 16.0
    default_max_sequence_length = DEFAULT_MAX_SEQUENCE_LENGTH
    tiny_writer = "wfm_jax.families.wan.tiny:write_pipeline"

    def __init__(self, directory: str, transformer, vae, text_encoder, tokenizer,
                 transformer_config: dict, vae_config: dict, scheduler_config: dict):
        self.directory = directory
        self.transformer = transformer
        self.vae = vae
        self.text_encoders = (text_encoder,)
        self.tokenizer = tokenizer
        self.transformer_config = transformer_config
        self.vae_config = vae_config
        self.scheduler_config = scheduler_config

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, directory: str, *, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
             text_dtype=None, frozen_param_dtype=None,
             options: ModelOptions | None = None) -> WanPipeline:
        """Every component of a local diffusers WanPipeline dir straight onto `mesh`.
        options (a ModelOptions) go to the transformer (attention_impl, remat). The VAE computes in
        its input's dtype: fp32 latents and pixels, as diffusers' Wan pipelines run it."""
        info = read_model_index(directory)
        if info.get("_class_name") != cls.pipeline_class:
            raise PipelineError(f"{directory} holds a {info.get('_class_name')!r}, not a "
                                f"{cls.pipeline_class}")
        for name in _REQUIRED:
            if not component_present(info, directory, name):
                raise PipelineError(f"pipeline {directory} lacks its {name!r} component")
        _refuse_wan22(info, directory)
        kw = dict(param_dtype=param_dtype, mesh=mesh, rules=rules)
        transformer, t_cfg = load_model(directory, component="transformer", dtype=dtype, **kw,
                                        **(options.constructor_kwargs() if options else {}))
        frozen = dict(kw, param_dtype=frozen_param_dtype or param_dtype)
        vae, v_cfg = load_model(directory, component="vae", dtype=None, **frozen)
        text_encoder, _ = load_model(directory, component="text_encoder", dtype=text_dtype,
                                     **frozen)
        tokenizer = _load_tokenizer(directory, info["tokenizer"])
        s_cfg = read_json(os.path.join(directory, "scheduler", "scheduler_config.json"))
        return cls(directory, transformer, vae, text_encoder, tokenizer, t_cfg, v_cfg, s_cfg)

    # ------------------------------------------------------------------ geometry
    @property
    def shift(self) -> float:
        """UniPC's "flow_shift" (Wan's scheduler); FlowMatchEuler's "shift" (an early 14B
        revision names that scheduler)."""
        s = self.scheduler_config
        return float(s["flow_shift"] if "flow_shift" in s else s.get("shift", 1.0))

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler_config.get("num_train_timesteps", 1000))

    def sampler_schedule(self, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(sigmas (N+1,), timesteps (N,)) of the default solver, as diffusers' UniPC sets them."""
        from wfm_jax.sampling.schedule import unipc_flow_schedule
        return unipc_flow_schedule(num_steps, self.shift, self.num_train_timesteps)

    @property
    def vae_factors(self) -> tuple[int, int]:
        """(temporal, spatial) VAE factors as diffusers' pipeline reads them (config, with the
        architecture's when the config leaves them out)."""
        cfg = as_config(self.vae_config)
        return (int(cfg.scale_factor_temporal or cfg.temporal_factor),
                int(cfg.scale_factor_spatial or cfg.spatial_factor))

    def cond_shapes(self, batch: int, text_len: int) -> dict[str, tuple[int, ...]]:
        return {"encoder_hidden_states": (batch, text_len, self.transformer_config["text_dim"])}

    def cond_storage_dtypes(self, compute_dtype) -> dict[str, Any]:
        """The UMT5 states in the compute dtype: the DiT casts them to that dtype first
        (WanTransformer3DModel.__call__: encoder_hidden_states.astype(dtype))."""
        return {COND_KEY: jnp.dtype(compute_dtype)}

    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, int, int, int, int]:
        """(B, C, (frames-1)/r + 1, H/f, W/f); frames must be r*k+1 and H, W multiples of the
        VAE factor times the patch size (diffusers rounds them with a warning; we refuse)."""
        r, f = self.vae_factors
        pt, ph, pw = (int(p) for p in self.transformer_config["patch_size"])
        if frames is None or frames < 1 or (frames - 1) % r:
            raise ValueError(f"Wan takes {r}k+1 frames (1, {r + 1}, {2 * r + 1}, ..., 81); "
                             f"got {frames}")
        if height % (f * ph) or width % (f * pw) or height <= 0 or width <= 0:
            raise ValueError(f"height {height} and width {width} must be positive multiples of "
                             f"{f * ph} and {f * pw} (VAE factor {f} x patch size {ph}, {pw})")
        t = (frames - 1) // r + 1
        if t % pt:
            raise ValueError(f"{frames} frames give {t} latent frames, not a multiple of the "
                             f"temporal patch size {pt}")
        most = int(self.transformer_config.get("rope_max_seq_len", 1024))
        grid = (t // pt, height // (f * ph), width // (f * pw))
        if max(grid) > most:
            raise ValueError(f"{frames}x{height}x{width} gives a patch grid {grid}; this model's "
                             f"rotary table covers at most {most} per axis (rope_max_seq_len)")
        return (batch, int(self.transformer_config["in_channels"]), t, height // f, width // f)

    # ------------------------------------------------------------------ text
    def tokenize(self, prompts: Sequence[str],
                 max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH) -> dict[str, np.ndarray]:
        """{"input_ids", "attention_mask"} (B, L) int32, cleaned and padded as diffusers."""
        out = self.tokenizer([prompt_clean(p) for p in prompts], padding="max_length",
                             max_length=max_sequence_length, truncation=True,
                             add_special_tokens=True, return_attention_mask=True,
                             return_tensors="np")
        return {"input_ids": np.asarray(out["input_ids"], np.int32),
                "attention_mask": np.asarray(out["attention_mask"], np.int32)}

    def encode_text_with(self, text_encoders, ids: Mapping,
                         max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH) -> dict:
        """{"encoder_hidden_states": (B, max_sequence_length, D) fp32}: UMT5's last hidden
        state under the mask, rows past each prompt's token count set to zero."""
        mask = jnp.asarray(ids["attention_mask"])
        states = text_encoders[0](jnp.asarray(ids["input_ids"]), mask).astype(jnp.float32)
        seq_lens = jnp.sum(mask > 0, axis=1)  # diffusers: u[:v] then zero rows (same thing)
        keep = jnp.arange(states.shape[1])[None, :] < seq_lens[:, None]
        states = jnp.where(keep[..., None], states, 0.0)
        pad = max_sequence_length - states.shape[1]
        if pad:  # ids shorter than max_sequence_length (padded elsewhere): zero rows
            states = jnp.pad(states, ((0, 0), (0, pad), (0, 0)))
        return {COND_KEY: states}

    def cond_from_embedding(self, embedding) -> dict[str, np.ndarray]:
        """A precomputed UMT5 embedding (B, L, text_dim), bare or under "encoder_hidden_states"
        (or a one-entry dict), as the pipeline's prompt_embeds."""
        if isinstance(embedding, Mapping):
            if COND_KEY in embedding:
                embedding = embedding[COND_KEY]
            elif len(embedding) == 1:
                embedding = next(iter(embedding.values()))
            else:
                raise ValueError(f"a Wan text embedding must be one array or hold "
                                 f"{COND_KEY!r}; got keys {sorted(embedding)}")
        arr = np.asarray(embedding, np.float32)
        dim = int(self.transformer_config["text_dim"])
        if arr.ndim != 3 or arr.shape[-1] != dim:
            raise ValueError(f"a Wan text embedding must be (batch, tokens, {dim}); got "
                             f"{arr.shape}")
        return {COND_KEY: arr}

    # ------------------------------------------------------------------ denoiser
    def velocity_with(self, transformer, latents, timesteps, cond: Mapping) -> jax.Array:
        """The DiT on (B, C, T, h, w) latents; timesteps (B,) 1000 sigma, fed unchanged."""
        return transformer(latents, timesteps, cond[COND_KEY])
