"""SANA1.5 text-to-image (diffusers `SanaPipeline`) as a model family, and what it shares with
SANA-Video (video_pipeline.py): loading, the Gemma2 text path, the DPM-Solver++ schedule.

Components: SanaTransformer2DModel (transformer.py), AutoencoderDC (models/dcae), Gemma2Model
(models/text/gemma2.py) and its tokenizer; the scheduler is DPM-Solver++ with flow sigmas
(sampling/dpm_solver.py), whose config gives flow_shift.

Each operation as diffusers' `pipelines/sana/pipeline_sana.py` computes it:
- text: prompts lower-cased and stripped; the complex human instruction (CHI) lines joined by
  newlines and prefixed; tokenised right-padded to n_chi + L - 2 (n_chi: the instruction's token
  count with BOS), or to L without it; Gemma2's last hidden state under the mask; then the first
  token and the last L - 1 kept, mask alike. The mask is part of the conditioning and goes to
  the transformer's cross-attention as `encoder_attention_mask` (cosmos-rl drops it in training).
- timesteps: the DiT takes diffusers' int64 scheduler timesteps (1000 sigma truncated) times the
  transformer's timestep_scale (images only; SANA-Video has none);
- latents: (B, C, H/f, W/f), z * scaling_factor; decode divides, then (x / 2 + 0.5).clamp(0, 1).
Sizes must be multiples of 32 (diffusers' check_inputs, whatever the VAE factor).

The instruction is applied by `tokenize`, the one place every caller (generate, training,
rollouts, validation) goes through, so all of them see the same text. diffusers encodes the
negative prompt without it: `tokenize_negative` (what generate and the trainers call for CFG's
unconditional branch) gives that encoding.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from converters.loading import load_model, read_json
from wfm_jax.families.base import PipelineError, PipelineFamily, component_present, read_model_index
from wfm_jax.families.sana import LORA_TARGETS
from wfm_jax.models.dcae import scale_latents, unscale_latents
from wfm_jax.models.dcae.autoencoder_dc import as_config
from wfm_jax.models.options import ModelOptions
from wfm_jax.models.text.gemma2 import select_sana_tokens

DEFAULT_MAX_SEQUENCE_LENGTH = 300  # both SANA pipelines' __call__ default
SIZE_MULTIPLE = 32                 # both SANA pipelines' check_inputs
TEXT_KEY, MASK_KEY = "encoder_hidden_states", "encoder_attention_mask"
_REQUIRED = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
# diffusers' key names for a precomputed embedding (pipeline arguments), accepted as aliases
_ALIASES = {TEXT_KEY: "prompt_embeds", MASK_KEY: "prompt_attention_mask"}

# SanaPipeline.__call__'s complex_human_instruction default
IMAGE_INSTRUCTION = (
    "Given a user prompt, generate an 'Enhanced prompt' that provides detailed visual "
    "descriptions suitable for image generation. Evaluate the level of detail in the user "
    "prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, "
    "and spatial relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly "
    "without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round "
    "shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red "
    "flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, "
    "featuring glowing street lamps, a diverse crowd of people in colorful clothing, and a "
    "double-decker bus passing by towering glass skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any "
    "additional commentary or evaluations:",
    "User Prompt: ",
)


def _load_tokenizer(directory: str, entry):
    import transformers
    cls = getattr(transformers, entry[1], None) if entry and entry[1] else None
    tok = (cls or transformers.AutoTokenizer).from_pretrained(os.path.join(directory,
                                                                           "tokenizer"))
    tok.padding_side = "right"  # what SANA's encode_prompt sets before every call
    return tok


class SanaFamily(PipelineFamily):
    """What SanaPipeline and SanaVideoPipeline share. Subclasses set the class attributes,
    `instruction_default`, and implement the geometry, the VAE and `_timesteps`."""

    default_solver = "dpm_solver"  # DPMSolverMultistepScheduler, flow sigmas, 2M midpoint
    lora_targets = LORA_TARGETS
    default_max_sequence_length = DEFAULT_MAX_SEQUENCE_LENGTH
    instruction_default: ClassVar[tuple[str, ...]]

    def cond_shapes(self, batch: int, text_len: int) -> dict[str, tuple[int, ...]]:
        return {"encoder_hidden_states": (batch, text_len, self.transformer_config["caption_channels"]),
                "encoder_attention_mask": (batch, text_len)}

    def __init__(self, directory: str, transformer, vae, text_encoder, tokenizer,
                 transformer_config: dict, vae_config: dict, scheduler_config: dict,
                 text_config: dict, instruction: Sequence[str] | None = None):
        self.directory = directory
        self.transformer = transformer
        self.vae = vae
        self.text_encoders = (text_encoder,)
        self.tokenizer = tokenizer
        self.transformer_config = transformer_config
        self.vae_config = vae_config
        self.scheduler_config = scheduler_config
        self.text_config = text_config
        # None: the pipeline's default instruction; () or []: none (complex_human_instruction=None)
        self.instruction = tuple(self.instruction_default if instruction is None else instruction)

    # ------------------------------------------------------------------ construction
    @classmethod
    def weightless(cls, configs, directory=None, vae=None) -> SanaFamily:
        pipe = super().weightless(configs, directory, vae)
        pipe.instruction = tuple(cls.instruction_default)  # the pipeline's default prefix
        return pipe

    @classmethod
    def load(cls, directory: str, *, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
             text_dtype=None, frozen_param_dtype=None, options: ModelOptions | None = None,
             instruction: Sequence[str] | None = None) -> SanaFamily:
        """Every component of a local diffusers pipeline dir straight onto `mesh`.
        options (a ModelOptions) go to the transformer (attention_impl, remat); instruction: the
        complex human instruction lines (None: the pipeline's default; (): none)."""
        info = read_model_index(directory)
        if info.get("_class_name") != cls.pipeline_class:
            raise PipelineError(f"{directory} holds a {info.get('_class_name')!r}, not a "
                                f"{cls.pipeline_class}")
        for name in _REQUIRED:
            if not component_present(info, directory, name):
                raise PipelineError(f"pipeline {directory} lacks its {name!r} component")
        cls._refuse(info, directory)
        t_cfg = read_json(os.path.join(directory, "transformer", "config.json"))
        if t_cfg.get("guidance_embeds"):  # SANA-Sprint: diffusers' SanaPipeline cannot run it
            raise PipelineError(f"{directory}: a transformer with guidance_embeds=True (SANA-"
                                f"Sprint) is not supported by {cls.pipeline_class}")
        kw = dict(param_dtype=param_dtype, mesh=mesh, rules=rules)
        transformer, t_cfg = load_model(directory, component="transformer", dtype=dtype, **kw,
                                        **(options.constructor_kwargs() if options else {}))
        frozen = dict(kw, param_dtype=frozen_param_dtype or param_dtype)
        vae, v_cfg = load_model(directory, component="vae", dtype=None, **frozen)
        text_encoder, x_cfg = load_model(directory, component="text_encoder", dtype=text_dtype,
                                         **frozen)
        tokenizer = _load_tokenizer(directory, info["tokenizer"])
        s_cfg = read_json(os.path.join(directory, "scheduler", "scheduler_config.json"))
        return cls(directory, transformer, vae, text_encoder, tokenizer, t_cfg, v_cfg, s_cfg,
                   x_cfg, instruction)

    @classmethod
    def _refuse(cls, info: Mapping, directory: str) -> None:
        """PipelineError for a variant of this pipeline that the family does not cover."""

    # ------------------------------------------------------------------ schedule
    @property
    def shift(self) -> float:
        return float(self.scheduler_config.get("flow_shift", 1.0))

    def sampler_schedule(self, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(sigmas (N+1,), int64-valued timesteps (N,)) as DPMSolverMultistepScheduler sets
        them with flow sigmas."""
        from wfm_jax.sampling.dpm_solver import dpm_solver_flow_schedule
        return dpm_solver_flow_schedule(num_steps, self.shift,
                                        int(self.scheduler_config.get("num_train_timesteps",
                                                                      1000)))

    def _check_size(self, height: int, width: int, multiple: int) -> None:
        if height <= 0 or width <= 0 or height % multiple or width % multiple:
            raise ValueError(f"{self.pipeline_class} needs height and width that are positive "
                             f"multiples of {multiple}; got {height}x{width}")

    # ------------------------------------------------------------------ text
    def tokenize(self, prompts: Sequence[str],
                 max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH, *,
                 instruction: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """{"input_ids", "attention_mask"} (B, n) int32 as _get_gemma_prompt_embeds tokenises:
        lower-cased prompts, the instruction (default: self.instruction) prefixed, right-padded
        and truncated to n = n_chi + L - 2 (L without an instruction)."""
        lines = self.instruction if instruction is None else tuple(instruction)
        texts = [p.lower().strip() for p in prompts]  # _text_preprocessing, clean_caption=False
        total = int(max_sequence_length)
        if lines:
            chi = "\n".join(lines)
            texts = [chi + t for t in texts]
            total = len(self.tokenizer.encode(chi)) + max_sequence_length - 2
        most = self.text_config.get("max_position_embeddings")
        if most and total > int(most):
            what = (f"the instruction plus a {max_sequence_length}-token prompt" if lines
                    else f"a {max_sequence_length}-token prompt")
            raise ValueError(f"{what} is {total} tokens, more than the text encoder's "
                             f"max_position_embeddings {most}; shorten max_sequence_length"
                             + (" or the instruction (instruction=() turns it off)" if lines
                                else ""))
        out = self.tokenizer(texts, padding="max_length", max_length=total, truncation=True,
                             add_special_tokens=True, return_attention_mask=True,
                             return_tensors="np")
        return {"input_ids": np.asarray(out["input_ids"], np.int32),
                "attention_mask": np.asarray(out["attention_mask"], np.int32)}

    def tokenize_negative(self, prompts: Sequence[str],
                          max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH) -> dict:
        """diffusers encodes the negative prompt without the instruction."""
        return self.tokenize(prompts, max_sequence_length, instruction=())

    def encode_text_with(self, text_encoders, ids: Mapping,
                         max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH) -> dict:
        """{"encoder_hidden_states" (B, L, D) fp32, "encoder_attention_mask" (B, L) fp32 0/1}:
        Gemma2 under the mask, then BOS plus the last L - 1 tokens (an identity without an
        instruction, where the ids are already L long)."""
        mask = jnp.asarray(ids["attention_mask"])
        states = text_encoders[0](jnp.asarray(ids["input_ids"]), mask).astype(jnp.float32)
        states, mask = select_sana_tokens(states, mask, max_sequence_length)
        return {TEXT_KEY: states, MASK_KEY: mask.astype(jnp.float32)}

    def cond_from_embedding(self, embedding) -> dict[str, np.ndarray]:
        """A precomputed embedding dict: "encoder_hidden_states" (B, L, caption_channels) and
        its "encoder_attention_mask" (B, L) (or diffusers' prompt_embeds /
        prompt_attention_mask). A bare array is refused: SANA's cross-attention needs the mask."""
        if not isinstance(embedding, Mapping):
            raise ValueError(f"a SANA text embedding must be a dict holding {TEXT_KEY!r} and "
                             f"{MASK_KEY!r} (the mask reaches cross-attention); got a bare array")
        found = {}
        for key, alias in _ALIASES.items():
            value = embedding.get(key, embedding.get(alias))
            if value is None:
                raise ValueError(f"a SANA text embedding needs {key!r} (or {alias!r}); got keys "
                                 f"{sorted(embedding)}")
            found[key] = np.asarray(value, np.float32)
        states, mask = found[TEXT_KEY], found[MASK_KEY]
        dim = int(self.transformer_config.get("caption_channels", 2304))
        if states.ndim != 3 or states.shape[-1] != dim or mask.shape != states.shape[:2]:
            raise ValueError(f"a SANA text embedding must be (batch, tokens, {dim}) with a "
                             f"(batch, tokens) mask; got {states.shape} and {mask.shape}")
        return {TEXT_KEY: states, MASK_KEY: mask}

    # ------------------------------------------------------------------ denoiser
    def _timesteps(self, timesteps) -> jax.Array:
        return jnp.asarray(timesteps, jnp.float32)

    def velocity_with(self, transformer, latents, timesteps, cond: Mapping) -> jax.Array:
        """The DiT with the text mask on its cross-attention; a learned-sigma output
        (out_channels = 2 x in_channels) keeps its first half, as the pipelines do."""
        out = transformer(latents, cond[TEXT_KEY], self._timesteps(timesteps),
                          encoder_attention_mask=cond[MASK_KEY])
        channels = int(self.transformer_config["in_channels"])
        if int(self.transformer_config.get("out_channels") or channels) // 2 == channels:
            out = out[:, :channels]
        return out


class SanaPipeline(SanaFamily):
    pipeline_class = "SanaPipeline"
    family = "sana"
    # SanaPipeline.__call__'s defaults
    default_steps, default_guidance = 20, 4.5
    instruction_default = IMAGE_INSTRUCTION
    tiny_writer = "wfm_jax.families.sana.tiny:write_pipeline"

    @property
    def spatial_factor(self) -> int:
        """diffusers' SanaPipeline.vae_scale_factor: 2 ** (len(encoder_block_out_channels) - 1)."""
        return 2 ** (len(self.vae_config["encoder_block_out_channels"]) - 1)

    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, int, int, int]:
        """(B, C, H/f, W/f); H and W multiples of 32 (and of the VAE factor x patch size)."""
        f, p = self.spatial_factor, int(self.transformer_config.get("patch_size", 1))
        self._check_size(height, width, math.lcm(SIZE_MULTIPLE, f * p))
        return (batch, int(self.transformer_config["in_channels"]), height // f, width // f)

    def _timesteps(self, timesteps) -> jax.Array:
        """SanaPipeline: t * transformer.config.timestep_scale."""
        scale = float(self.transformer_config.get("timestep_scale", 1.0))
        return jnp.asarray(timesteps, jnp.float32) * scale

    # ------------------------------------------------------------------ VAE
    def posterior_with(self, vae, pixels) -> tuple[jax.Array, jax.Array]:
        """(B, H, W, 3) in [-1, 1] -> (latent, 0): DC-AE is deterministic (`encode(x).latent`)."""
        if pixels.ndim != 4 or pixels.shape[-1] != 3:
            raise ValueError(f"SANA encodes images (batch, height, width, 3); got "
                             f"{tuple(pixels.shape)}")
        z = vae.encode(jnp.moveaxis(jnp.asarray(pixels), -1, 1))
        return z, jnp.zeros_like(z)

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        return scale_latents(z.astype(jnp.float32), as_config(self.vae_config))

    def decode_with(self, vae, latents) -> jax.Array:
        """latents / scaling_factor, DC-AE decode, PixArtImageProcessor's (x / 2 + 0.5)
        .clamp(0, 1), channels last."""
        image = vae.decode(unscale_latents(jnp.asarray(latents, jnp.float32),
                                           as_config(self.vae_config)))
        image = jnp.clip(image.astype(jnp.float32) / 2 + 0.5, 0.0, 1.0)
        return jnp.transpose(image, (0, 2, 3, 1))
