"""SANA-Video text-to-video (diffusers `SanaVideoPipeline`) as a model family.

Text, schedule and loading are SANA's (pipeline.py: Gemma2 + the video instruction, DPM-Solver++
with flow sigmas). What differs, as diffusers' `pipelines/sana_video/pipeline_sana_video.py`
computes it:
- the DiT (SanaVideoTransformer3DModel) takes the scheduler's int64 timesteps as they are;
- latents: (B, C, (frames-1)/4 + 1, H/8, W/8) for the Wan2.1 VAE, normalised per channel with
  its latents_mean/std (the Wan family's functions); decode: the inverse, the Wan decode, then
  VideoProcessor's (x / 2 + 0.5).clamp(0, 1);
- the frame count is whatever the caller asks (cosmos-rl's rollout always sampled 81).
Only the Wan VAE (the 480p release) is supported; the 720p LTX2 VAE is refused by name.
"""
from __future__ import annotations

import math

from wfm_jax.families.base import PipelineError
from wfm_jax.families.sana.pipeline import SIZE_MULTIPLE, SanaFamily
from wfm_jax.models.wan.vae import as_config
from wfm_jax.models.wan.video_latents import WanVideoLatents

# SanaVideoPipeline.__call__'s complex_human_instruction default
VIDEO_INSTRUCTION = (
    "Given a user prompt, generate an 'Enhanced prompt' that provides detailed visual "
    "descriptions suitable for video generation. Evaluate the level of detail in the user "
    "prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, "
    "motion, and temporal relationships to create vivid and dynamic scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly "
    "without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat slowly settling into a "
    "curled position, peacefully falling asleep on a warm sunny windowsill, with gentle sunlight "
    "filtering through surrounding pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, "
    "featuring glowing street lamps gradually lighting up, a diverse crowd of people in colorful "
    "clothing walking past, and a double-decker bus smoothly passing by towering glass "
    "skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any "
    "additional commentary or evaluations:",
    "User Prompt: ",
)


class SanaVideoPipeline(WanVideoLatents, SanaFamily):
    pipeline_class = "SanaVideoPipeline"
    family = "sana_video"
    is_video = True
    # SanaVideoPipeline.__call__'s defaults (frames=81 at 16 fps)
    default_steps, default_guidance, default_frames, default_fps = 50, 6.0, 81, 16.0
    instruction_default = VIDEO_INSTRUCTION
    tiny_writer = "wfm_jax.families.sana.tiny:write_video_pipeline"

    @classmethod
    def _refuse(cls, info, directory: str) -> None:
        vae = info.get("vae") or [None, None]
        if vae[1] != "AutoencoderKLWan":
            raise PipelineError(f"{directory}: SanaVideoPipeline with a {vae[1]} VAE is not "
                                f"supported; only AutoencoderKLWan (the 480p release) is")

    @property
    def vae_factors(self) -> tuple[int, int]:
        """(temporal, spatial) as the pipeline reads them (scale_factor_* of the Wan config)."""
        cfg = as_config(self.vae_config)
        return (int(cfg.scale_factor_temporal or cfg.temporal_factor),
                int(cfg.scale_factor_spatial or cfg.spatial_factor))

    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, int, int, int, int]:
        """(B, C, (frames-1)/r + 1, H/f, W/f); frames = r k + 1 (so the decode gives back as
        many), H and W multiples of 32 (and of the VAE factor x patch size)."""
        r, f = self.vae_factors
        pt, ph, pw = (int(p) for p in self.transformer_config["patch_size"])
        if frames is None or frames < 1 or (frames - 1) % r:
            raise ValueError(f"SANA-Video takes {r}k+1 frames (1, {r + 1}, {2 * r + 1}, ..., 81); "
                             f"got {frames}")
        self._check_size(height, width, math.lcm(SIZE_MULTIPLE, f * ph, f * pw))
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
