"""Cosmos-Predict2.5 text2world / video2world (diffusers `Cosmos2_5_PredictBasePipeline`) as a
model family.

Components: CosmosTransformer3DModel (transformer.py), the Wan VAE (models/wan/vae.py, fp32),
the Qwen2.5-VL (Cosmos-Reason1) text tower alone (models/text/qwen_loading.py) and its tokenizer;
the scheduler is UniPC on Karras sigmas mapped to flow sigmas (sigma / (1 + sigma)). The
`safety_checker` (cosmos_guardrail) is not a model of ours: it is neither loaded nor required.

What differs from Wan, each as diffusers' `pipeline_cosmos2_5_predict.py` computes it:
- text: the Reason1 embedding (text_embedding.py): every hidden state normalised, concatenated;
- timesteps: the DiT takes sigma in [0, 1] per latent frame (B, 1, T', 1, 1); wfm_jax feeds
  1000 sigma everywhere (rollout and training alike) and `velocity_with` divides by 1000;
- conditioning frames (video2world): the cond dict may hold
    "cond_latents" (B, C, T', h, w) normalised latents of the conditioning video (only the frames
                   under the mask are read),
    "cond_mask"    (B, 1, T', 1, 1) 1 on conditioned latent frames, 0 elsewhere,
    "cond_velocity" (B, C, T', h, w), optional: the velocity reported on conditioned frames.
  The DiT sees the conditioned frames replaced by cond_latents at `conditional_frame_timestep`
  (1e-4) and the mask as its extra input channel; on those frames its prediction is replaced by
  cond_velocity (diffusers: initial noise - cond_latents), or, without it, by
  (x - cond_latents) / sigma: the same thing for any x on the flow line x = (1-s) c + s n, which
  is every training sample. Text2world is a cond dict without these keys (mask zero).
- CFG: v_c + w (v_c - v_u) (`guide`), run when w > 1.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters.loading import load_model, read_json
from wfm_jax.families.base import PipelineError, PipelineFamily, component_present, read_model_index
from wfm_jax.families.cosmos import LORA_TARGETS
from wfm_jax.models.cosmos import text_embedding as te
from wfm_jax.models.options import ModelOptions
from wfm_jax.models.wan.vae import as_config
from wfm_jax.models.wan.video_latents import WanVideoLatents

COND_KEY = "encoder_hidden_states"
FRAME_KEYS = ("cond_latents", "cond_mask")  # present together or not at all
CONDITIONAL_FRAME_TIMESTEP = 1e-4  # Cosmos2_5_PredictBasePipeline.__call__'s default
# cosmos-predict2.5 schedulers/rectified_flow.py RectifiedFlow(train_time_distribution=
# "logitnormal", shift=5): its training sigma is 5u / (1 + 4u), u = sigmoid(N(0, 1))
TRAIN_SHIFT = 5.0
_REQUIRED = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
# Cosmos2_5_PredictBasePipeline's DEFAULT_NEGATIVE_PROMPT (used when no negative prompt is given)
DEFAULT_NEGATIVE_PROMPT = (
    "The video captures a series of frames showing ugly scenes, static with no motion, motion "
    "blur, over-saturation, shaky footage, low resolution, grainy texture, pixelated images, "
    "poorly lit areas, underexposed and overexposed scenes, poor color balance, washed out "
    "colors, choppy sequences, jerky movements, low frame rate, artifacting, color banding, "
    "unnatural transitions, outdated special effects, fake elements, unconvincing visuals, "
    "poorly edited content, jump cuts, visual noise, and flickering. Overall, the video is of "
    "poor quality.")


def karras_flow_sigmas(num_steps: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """UniPCMultistepScheduler(use_karras_sigmas=True, use_flow_sigmas=True).set_timesteps:
    Karras' rho-7 ramp from sigma_max to sigma_min, mapped s / (s + 1), then a final 0;
    float32 (N+1,)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    rho = 7.0
    ramp = np.linspace(0, 1, num_steps)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    s = (hi + ramp * (lo - hi)) ** rho
    return np.concatenate([s / (s + 1), [0.0]]).astype(np.float32)


class CosmosPipeline(WanVideoLatents, PipelineFamily):
    pipeline_class = "Cosmos2_5_PredictBasePipeline"
    family = "cosmos"
    lora_targets = LORA_TARGETS
    display_name = "Cosmos"
    is_video = True
    supports_video_condition = True
    default_solver = "unipc"
    # Cosmos2_5_PredictBasePipeline.__call__'s defaults; fps: its examples' export_to_video
    default_steps, default_guidance, default_frames, default_fps = 36, 7.0, 93, 16.0
    default_max_sequence_length = te.MAX_SEQUENCE_LENGTH
    default_negative_prompt = DEFAULT_NEGATIVE_PROMPT
    conditional_frame_timestep = CONDITIONAL_FRAME_TIMESTEP
    tiny_writer = "wfm_jax.families.cosmos.tiny:write_pipeline"

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
             options: ModelOptions | None = None) -> CosmosPipeline:
        """Every component of a local Cosmos2_5_PredictBasePipeline dir onto `mesh`; of the
        text encoder only the text tower (the vision tower and lm_head are never used)."""
        from converters.qwen_loading import load_text_tower
        info = read_model_index(directory)
        if info.get("_class_name") != cls.pipeline_class:
            raise PipelineError(f"{directory} holds a {info.get('_class_name')!r}, not a "
                                f"{cls.pipeline_class}")
        for name in _REQUIRED:
            if not component_present(info, directory, name):
                raise PipelineError(f"pipeline {directory} lacks its {name!r} component")
        kw = dict(param_dtype=param_dtype, mesh=mesh, rules=rules)
        transformer, t_cfg = load_model(directory, component="transformer", dtype=dtype, **kw,
                                        **(options.constructor_kwargs() if options else {}))
        frozen = dict(kw, param_dtype=frozen_param_dtype or param_dtype)
        vae, v_cfg = load_model(directory, component="vae", dtype=None, **frozen)
        text_encoder, _ = load_text_tower(directory, dtype=text_dtype, **frozen)
        tokenizer = te.load_tokenizer(directory)
        s_cfg = read_json(os.path.join(directory, "scheduler", "scheduler_config.json"))
        return cls(directory, transformer, vae, text_encoder, tokenizer, t_cfg, v_cfg, s_cfg)

    def static_key(self) -> tuple:
        return super().static_key() + (self.conditional_frame_timestep,)

    # ------------------------------------------------------------------ geometry
    def sampler_schedule(self, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """(sigmas (N+1,), 1000 sigmas (N,)): the scheduler's Karras flow sigmas. The DiT is fed
        the float sigmas (diffusers passes scheduler.sigmas[i], not its int timesteps)."""
        s = self.scheduler_config
        if not (s.get("use_karras_sigmas") and s.get("use_flow_sigmas")) or \
                s.get("final_sigmas_type", "zero") != "zero":
            raise PipelineError("Cosmos's scheduler must have use_karras_sigmas and "
                                "use_flow_sigmas set and final_sigmas_type 'zero' (as the "
                                "released pipeline)")
        sigmas = karras_flow_sigmas(num_steps, float(s["sigma_min"]), float(s["sigma_max"]))
        return sigmas, sigmas[:-1] * np.float32(1000)

    def flow_schedule(self, num_steps: int, solver: str) -> tuple[np.ndarray, np.ndarray]:
        """Every flow sampler steps on the scheduler's Karras flow sigmas (sigma in about
        [0.0099, 0.995], the range the DiT was trained on), not the flow-matching grid from 1."""
        del solver
        return self.sampler_schedule(num_steps)

    def sigma_range(self) -> tuple[float, float]:
        """The flow sigmas the scheduler samples between: sigma_min / (1 + sigma_min) and
        sigma_max / (1 + sigma_max) (about 0.0099 and 0.995 for [0.01, 200])."""
        lo, hi = (float(self.scheduler_config[k]) for k in ("sigma_min", "sigma_max"))
        return lo / (1 + lo), hi / (1 + hi)

    def train_sigma_table(self, shift: float) -> tuple[np.ndarray, np.ndarray]:
        """SFT's sigmas in Cosmos' own range: cosmos-predict2.5's training draw (u from the
        recipe's density, logit-normal(0, 1) as its RectifiedFlow "logitnormal"; sigma =
        5u / (1 + 4u), its shift 5; the recipe's scheduler `shift` is not Cosmos' and is
        ignored), mapped affinely onto sigma_range() so training sees only the noise levels the
        Karras sampler visits (sigma 1, pure noise, is not one of them). wfm_jax's choice: the
        released training code samples over (0, 1]."""
        from wfm_jax.sampling.schedule import training_table
        del shift
        lo, hi = self.sigma_range()
        _, s = training_table(TRAIN_SHIFT)
        sigmas = (np.float32(lo) + np.float32(hi - lo) * s).astype(np.float32)
        return sigmas * np.float32(1000), sigmas

    @property
    def vae_factors(self) -> tuple[int, int]:
        """(temporal, spatial) as diffusers' pipeline computes them from temperal_downsample."""
        down = as_config(self.vae_config).temperal_downsample
        return 2 ** sum(bool(d) for d in down), 2 ** len(down)

    @property
    def latent_channels(self) -> int:
        return int(self.transformer_config["in_channels"]) - 1  # + the condition mask

    def cond_shapes(self, batch: int, text_len: int) -> dict[str, tuple[int, ...]]:
        t = self.transformer_config
        width = (t["crossattn_proj_in_channels"] if t.get("use_crossattn_projection")
                 else t["text_embed_dim"])
        return {"encoder_hidden_states": (batch, text_len, width)}

    def cond_storage_dtypes(self, compute_dtype) -> dict[str, Any]:
        """The Reason1 embedding (100,352 wide on the released 2B/14B) in the compute dtype: the
        DiT casts it to that dtype first (CosmosTransformer.__call__: context.astype(dtype))."""
        return {COND_KEY: jnp.dtype(compute_dtype)}

    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, int, int, int, int]:
        """(B, in_channels - 1, (frames-1)/r + 1, H/f, W/f); frames r*k+1, H and W multiples of
        f times the patch size, the patch grid within the rotary table (max_size)."""
        from wfm_jax.models.cosmos.transformer import cosmos_config
        r, f = self.vae_factors
        cfg = cosmos_config(self.transformer_config)
        pt, ph, pw = cfg["patch_size"]
        if frames is None or frames < 1 or (frames - 1) % r:
            raise ValueError(f"Cosmos takes {r}k+1 frames (1, {r + 1}, ..., 93); got {frames}")
        if height % (f * ph) or width % (f * pw) or height <= 0 or width <= 0:
            raise ValueError(f"height {height} and width {width} must be positive multiples of "
                             f"{f * ph} and {f * pw} (VAE factor {f} x patch size {ph}, {pw})")
        t = (frames - 1) // r + 1
        if t % pt:
            raise ValueError(f"{frames} frames give {t} latent frames, not a multiple of the "
                             f"temporal patch size {pt}")
        grid = (t // pt, height // (f * ph), width // (f * pw))
        most = max(m // p for m, p in zip(cfg["max_size"], cfg["patch_size"]))
        if max(grid) > most:
            raise ValueError(f"{frames}x{height}x{width} gives a patch grid {grid}; this model's "
                             f"rotary table covers at most {most} per axis (max_size)")
        return (batch, self.latent_channels, t, height // f, width // f)

    # ------------------------------------------------------------------ text
    def tokenize(self, prompts: Sequence[str],
                 max_sequence_length: int = te.MAX_SEQUENCE_LENGTH) -> dict[str, np.ndarray]:
        """{"input_ids": (B, L) int32}: the chat-templated prompts, no mask (diffusers passes
        none to the encoder)."""
        return {"input_ids": te.prompt_token_ids(self.tokenizer, prompts, max_sequence_length)}

    def encode_text_with(self, text_encoders, ids: Mapping,
                         max_sequence_length: int = te.MAX_SEQUENCE_LENGTH) -> dict:
        """{"encoder_hidden_states": (B, L, layers * hidden) fp32}: the Reason1 embedding."""
        return {COND_KEY: te.reason1_embedding(text_encoders[0], jnp.asarray(ids["input_ids"]),
                                               jnp.float32)}

    @property
    def text_width(self) -> int:
        """What the DiT's context takes: crossattn_proj's input, else text_embed_dim."""
        from wfm_jax.models.cosmos.transformer import cosmos_config
        cfg = cosmos_config(self.transformer_config)
        return int(cfg["crossattn_proj_in_channels"] if cfg["use_crossattn_projection"]
                   else cfg["text_embed_dim"])

    def cond_from_embedding(self, embedding) -> dict[str, np.ndarray]:
        """A precomputed Reason1 embedding (B, L, D), bare or under "encoder_hidden_states" (or a
        one-entry dict); one sample's (L, D) (the `wfm_jax.cli.embed` files) gains the batch axis."""
        if isinstance(embedding, Mapping):
            if COND_KEY in embedding:
                embedding = embedding[COND_KEY]
            elif len(embedding) == 1:
                embedding = next(iter(embedding.values()))
            else:
                raise ValueError(f"a Cosmos text embedding must be one array or hold "
                                 f"{COND_KEY!r}; got keys {sorted(embedding)}")
        arr = np.asarray(embedding, np.float32)
        arr = arr[None] if arr.ndim == 2 else arr
        dim = self.text_width
        if arr.ndim != 3 or arr.shape[-1] != dim:
            raise ValueError(f"a Cosmos text embedding must be (batch, tokens, {dim}) (the "
                             f"transformer's text input width); got {arr.shape}")
        return {COND_KEY: arr}

    # ------------------------------------------------------------------ denoiser
    def velocity_with(self, transformer, latents, timesteps, cond: Mapping) -> jax.Array:
        """The DiT on (B, C, T', h, w) latents. timesteps (B,) are 1000 sigma (rollout and
        training alike); the DiT gets sigma = timesteps / 1000 per latent frame, the conditioned
        frames (cond_mask) at conditional_frame_timestep with cond_latents in place of x, and
        their prediction replaced as the module docstring says."""
        x = jnp.asarray(latents, jnp.float32)
        b, _, t = x.shape[:3]
        sigma = (jnp.asarray(timesteps, jnp.float32) / 1000.0).reshape(b, 1, 1, 1, 1)
        if "cond_mask" not in cond:
            frames_t = jnp.broadcast_to(sigma, (b, 1, t, 1, 1))
            mask = jnp.zeros((b, 1) + x.shape[2:], x.dtype)
            v = transformer(x, frames_t, cond[COND_KEY], condition_mask=mask)
            return v.astype(jnp.float32)
        indicator = jnp.asarray(cond["cond_mask"], jnp.float32)
        c = jnp.asarray(cond["cond_latents"], jnp.float32)
        frames_t = indicator * self.conditional_frame_timestep + (1 - indicator) * sigma
        mask = jnp.broadcast_to(indicator, (b, 1) + x.shape[2:])
        v = transformer(mask * c + (1 - mask) * x, frames_t, cond[COND_KEY],
                        condition_mask=mask).astype(jnp.float32)
        if "cond_velocity" in cond:
            gt = jnp.asarray(cond["cond_velocity"], jnp.float32)
        else:  # noise - x0 for x on the flow line; sigma > 0 wherever a step is evaluated
            gt = (x - c) / jnp.maximum(sigma, 1e-6)
        return gt * mask + v * (1 - mask)

    def guide(self, v_cond: jax.Array, v_uncond: jax.Array, scale) -> jax.Array:
        """Cosmos' CFG: v_c + w (v_c - v_u) (the standard form at w + 1)."""
        return v_cond + jnp.asarray(scale, jnp.float32) * (v_cond - v_uncond)

    # ------------------------------------------------------------------ video2world
    def condition_from_video(self, vae, frames, num_conditional_frames: int,
                             latents) -> dict[str, jax.Array]:
        """The cond entries for video2world, as diffusers prepares them: the last
        4(n-1)+1 frames of `frames` ((B or 1, T, H, W, 3) in [0, 1], H and W the output's),
        padded with the last one to the output's frame count, VAE-encoded (the mode),
        normalised; the first n latent frames are conditioned; the velocity there is
        latents (the initial noise) - cond_latents."""
        if num_conditional_frames not in (1, 2):
            raise ValueError(f"num_conditional_frames must be 1 or 2, got "
                             f"{num_conditional_frames}")
        b, _, t_lat, h, w = latents.shape
        r, f = self.vae_factors
        frames = jnp.asarray(frames, jnp.float32)
        need = r * (num_conditional_frames - 1) + 1
        out_frames = r * (t_lat - 1) + 1
        if frames.ndim != 5 or frames.shape[-1] != 3 or frames.shape[2:4] != (h * f, w * f):
            raise ValueError(f"the conditioning video must be (batch, frames, {h * f}, {w * f}, 3)"
                             f" (the output's size); got {tuple(frames.shape)}")
        if frames.shape[1] < need:
            raise ValueError(f"the conditioning video has {frames.shape[1]} frames; "
                             f"{num_conditional_frames} conditional latent frames need {need}")
        if out_frames < need:
            raise ValueError(f"{out_frames} output frames cannot hold {need} conditional frames")
        video = frames[:, -need:]
        video = jnp.concatenate([video, jnp.repeat(video[:, -1:], out_frames - need, axis=1)],
                                axis=1)
        mean, _ = self.posterior_with(vae, video * 2 - 1)
        c = jnp.broadcast_to(self.normalize_latents(mean), latents.shape)
        mask = (jnp.arange(t_lat) < num_conditional_frames).astype(jnp.float32)
        mask = jnp.broadcast_to(mask.reshape(1, 1, t_lat, 1, 1), (b, 1, t_lat, 1, 1))
        return {"cond_latents": c, "cond_mask": mask,
                "cond_velocity": (jnp.asarray(latents, jnp.float32) - c) * mask}

    def video_condition(self, video_latents, counts) -> dict[str, jax.Array]:
        """{"cond_latents", "cond_mask"} for row i conditioned on its first counts[i] latent
        frames (cosmos-rl's world-model training conditions on a clip's first frames; the causal
        VAE makes them the latents of those frames alone). No cond_velocity: (x - c) / sigma,
        exact on every flow line through c."""
        c = jnp.asarray(video_latents, jnp.float32)
        b, t = c.shape[0], c.shape[2]
        n = jnp.asarray(counts, jnp.int32).reshape(b, 1)
        mask = (jnp.arange(t)[None, :] < n).astype(jnp.float32).reshape(b, 1, t, 1, 1)
        return {"cond_latents": c, "cond_mask": mask}

