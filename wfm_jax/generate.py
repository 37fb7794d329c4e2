"""Text-to-image / text-to-video with a local diffusers pipeline of any supported family, in JAX.

    python -m wfm_jax.generate --model DIR --prompt "a cat" --steps 28 --guidance 4.5 \
        --height 512 --width 512 --seed 0 --out cat.png [--latents init.npy] [--save-array x.npy]
    python -m wfm_jax.generate --model WAN_DIR --prompt "a cat" --frames 17 --out cat.mp4
    python -m wfm_jax.generate --model COSMOS_DIR --prompt "a cat" --video cond.mp4 \
        --num-conditional-frames 2 --out cat.mp4      (video2world: families that support it)

The family comes from the dir's model_index.json (models.family); --steps, --guidance,
--sampler, --max-sequence-length and --frames default to the family's (diffusers' pipeline
defaults). `--latents` takes initial latents in diffusers layout ((B, C, h, w), or
(B, C, T', h, w) for video), so a diffusers run can be reproduced exactly; `--save-array` writes
float pixels (B, H, W, C) or (B, T, H, W, C) in [0, 1] like diffusers' `output_type="np"`.
Several prompts are laid out as a grid in the PNG (images) or one .mp4 per prompt (video: the
first at --out, the others at OUT_1.mp4, ...). `--video` (.mp4, or .npy frames (T, H, W, 3) in
[0, 1], at --height x --width) conditions every prompt on its last frames, for families with
`supports_video_condition` (their `condition_from_video`).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax import xla_flags
from wfm_jax.mesh import mesh_jit, mesh_of
from wfm_jax.models.family import load_pipeline
from wfm_jax.sampling.dpm_solver import dpm_solver_flow_schedule
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import flow_sigmas, unipc_flow_schedule
from wfm_jax.train.encode import TextEncoder

# the deterministic flow samplers diffusers' pipelines run (dpm_solver: SANA's DPM-Solver++)
SAMPLERS = ("euler", "unipc", "dpm_solver")


def encode_prompts(pipe, prompts: Sequence[str], max_sequence_length: int,
                   negative: bool = False) -> dict:
    """The family's conditioning dict for `prompts` (negative: CFG's unconditional branch)."""
    encoder = TextEncoder(pipe, max_sequence_length)
    return encoder({k: jnp.asarray(v) for k, v in encoder.tokenize(prompts, negative).items()})


def schedule(pipe, sampler: str, steps: int):
    """(sigmas, timesteps or None) of `sampler` as its diffusers scheduler sets them: the
    family's own for its default solver, else the scheduler's defaults at the family's shift."""
    if sampler == pipe.default_solver:
        return pipe.sampler_schedule(steps)
    if sampler == "euler":
        return flow_sigmas(steps, pipe.shift)[0], None
    if sampler == "unipc":
        return unipc_flow_schedule(steps, pipe.shift)
    if sampler == "dpm_solver":
        return dpm_solver_flow_schedule(steps, pipe.shift)
    raise ValueError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")


def generate(pipe, prompts: Sequence[str], *, steps: int, guidance: float, height: int, width: int,
             seed: int = 0, latents=None, negative_prompt: str | None = None,
             max_sequence_length: int = 256, frames: int | None = None,
             sampler: str | None = None, video=None,
             num_conditional_frames: int = 2) -> np.ndarray:
    """Pixels (B, H, W, 3) (or (B, T, H, W, 3) for a video family) float32 in [0, 1] for
    `prompts`, as the family's diffusers pipeline gives with output_type="np". sampler: one of
    SAMPLERS, default the family's; negative_prompt: None is the family's default. video:
    (1 or B, T, H, W, 3) in [0, 1] to condition on (families with supports_video_condition)."""
    sampler = sampler or pipe.default_solver
    shape = pipe.latent_shape(len(prompts), height, width, frames=frames)
    if latents is None:
        latents = jax.random.normal(jax.random.key(seed), shape, jnp.float32)
    elif tuple(latents.shape) != shape:
        raise ValueError(f"--latents has shape {tuple(latents.shape)}; expected {shape} "
                         f"(diffusers layout) for {len(prompts)} prompt(s) at {height}x{width}")
    if negative_prompt is None:
        negative_prompt = pipe.default_negative_prompt
    graphdef, state = nnx.split(pipe.transformer)
    vae_def, vae_state = nnx.split(pipe.vae)
    family = pipe.shell()
    latents = jnp.asarray(latents, jnp.float32)
    extra = {}
    if video is not None:
        extra = video_condition(pipe, family, vae_def, vae_state, video, num_conditional_frames,
                                latents)
    cond = {**encode_prompts(pipe, prompts, max_sequence_length), **extra}
    uncond = None
    if guidance > 1:  # diffusers: do_classifier_free_guidance = guidance_scale > 1
        uncond = {**encode_prompts(pipe, [negative_prompt] * len(prompts), max_sequence_length,
                                   negative=True), **extra}
    sigmas, timesteps = schedule(pipe, sampler, steps)

    @mesh_jit(mesh=mesh_of(state))
    def run(state, vae_state, x, cond, uncond):
        transformer = nnx.merge(graphdef, state)
        velocity = lambda x, t, c: family.velocity_with(transformer, x, t, c)
        out = sample(velocity, x, sigmas, method=sampler, cond=cond, uncond=uncond,
                     cfg_scale=guidance, timesteps=timesteps, guide=family.guide)
        return family.decode_with(nnx.merge(vae_def, vae_state), out.latents)

    return np.asarray(run(state, vae_state, latents, cond, uncond))


def video_condition(pipe, family, vae_def, vae_state, video, num_conditional_frames: int,
                    latents) -> dict:
    """The family's cond entries for conditioning on `video` (one line when it has none)."""
    if not pipe.supports_video_condition:
        pipe.condition_from_video(None, video, num_conditional_frames, latents)  # its error
    video = np.asarray(video, np.float32)
    video = video[None] if video.ndim == 4 else video
    run = mesh_jit(mesh=mesh_of(vae_state))(
        lambda s, v, x: family.condition_from_video(nnx.merge(vae_def, s), v,
                                                    num_conditional_frames, x))
    return run(vae_state, jnp.asarray(video), latents)


def read_video(path: str) -> np.ndarray:
    """--video: .npy frames (T, H, W, 3) in [0, 1], or a video file's frames at their size."""
    try:
        if path.endswith(".npy"):
            frames = np.load(path, allow_pickle=False)
        else:
            from wfm_jax.data import media
            capture = media._cv2().VideoCapture(path)
            try:
                frames = np.stack([f[..., ::-1] for f in media._read_all(capture)]) / 255.0
            finally:
                capture.release()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read --video {path}: {e}")
    frames = np.asarray(frames, np.float32)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"--video {path} must hold frames (T, H, W, 3); got {frames.shape}")
    return frames


def to_grid(images: np.ndarray) -> np.ndarray:
    """(B, H, W, C) in [0, 1] -> one uint8 (rows*H, cols*W, C) grid, as square as possible."""
    b, h, w, c = images.shape
    cols = math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = np.zeros((rows * h, cols * w, c), np.uint8)
    pixels = np.round(images * 255).astype(np.uint8)  # diffusers numpy_to_pil rounds the same way
    for i in range(b):
        r, col = divmod(i, cols)
        grid[r * h:(r + 1) * h, col * w:(col + 1) * w] = pixels[i]
    return grid


def clip_paths(out: str, count: int) -> list[str]:
    """One .mp4 per prompt: OUT.mp4, OUT_1.mp4, ..."""
    stem = out[:-4] if out.endswith(".mp4") else out
    return [f"{stem}.mp4"] + [f"{stem}_{i}.mp4" for i in range(1, count)]


def save_outputs(images: np.ndarray, out: str | None, save_array: str | None,
                 fps: float = 16.0) -> list[str]:
    """Writes the array and the PNG grid (images) or the mp4 clips (video); returns the paths."""
    from PIL import Image
    from wfm_jax.media_out import write_mp4
    written = []
    for path in (out, save_array):
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    if save_array:
        tmp = save_array + ".tmp.npy"
        np.save(tmp, images.astype(np.float32))
        os.replace(tmp, save_array)
    if out and images.ndim == 5:
        written += [write_mp4(p, clip, fps) for p, clip in zip(clip_paths(out, len(images)),
                                                                images)]
    elif out:
        tmp = out + ".tmp.png"
        Image.fromarray(to_grid(images)).save(tmp, format="PNG")
        os.replace(tmp, out)
        written.append(out)
    return written + ([save_array] if save_array else [])


def read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ValueError(f"cannot read prompts file {args.prompts_file}: {e.strerror}")
    if not prompts:
        raise ValueError("give at least one --prompt or a non-empty --prompts-file")
    return prompts


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.generate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   help="local diffusers pipeline dir of a supported family (model_index.json)")
    p.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    p.add_argument("--prompts-file", help="one prompt per line")
    p.add_argument("--negative-prompt", help="default: the family's (diffusers' pipeline's)")
    p.add_argument("--steps", type=int, help="default: the family's (SD3: 28)")
    p.add_argument("--guidance", type=float, help="default: the family's (SD3: 4.5)")
    p.add_argument("--sampler", choices=SAMPLERS, help="default: the family's (SD3: euler)")
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--frames", type=int, help="video families: frames to generate "
                                              "(default: the family's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sequence-length", type=int, help="default: the family's (SD3: 256)")
    p.add_argument("--latents", help=".npy initial latents, diffusers layout")
    p.add_argument("--video", help="video to condition on (families that support it): .mp4, or "
                                   ".npy frames (T, H, W, 3) in [0, 1], at --height x --width")
    p.add_argument("--num-conditional-frames", type=int, default=2, choices=(1, 2),
                   help="latent frames of --video to condition on (its last 1 or 5 frames)")
    p.add_argument("--out", help="PNG grid (images) or .mp4 (video); default out.png / out.mp4")
    p.add_argument("--save-array", help=".npy path for float pixels (B, [T,] H, W, C) in [0, 1]")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    xla_flags.apply()  # before jax starts its backend
    try:
        prompts = read_prompts(args)
        latents = None
        if args.latents:
            try:
                latents = np.load(args.latents)
            except (OSError, ValueError) as e:
                raise ValueError(f"cannot read --latents {args.latents}: {e}")
        video = read_video(args.video) if args.video else None
        pipe = load_pipeline(args.model)
        if video is not None and not pipe.supports_video_condition:
            raise ValueError(f"--video: a {pipe.pipeline_class} cannot condition on a video "
                             f"(no family capability supports_video_condition)")
        if args.frames is not None and not pipe.is_video:
            raise ValueError(f"--frames applies to video families; {args.model} holds a "
                             f"{pipe.pipeline_class} (images)")
        frames = (args.frames or pipe.default_frames) if pipe.is_video else None
        pipe.latent_shape(len(prompts), args.height, args.width, frames=frames)  # fail early
        out = args.out or ("out.mp4" if pipe.is_video else "out.png")
        images = generate(pipe, prompts,
                          steps=args.steps or pipe.default_steps,
                          guidance=(pipe.default_guidance if args.guidance is None
                                    else args.guidance),
                          height=args.height, width=args.width, seed=args.seed, latents=latents,
                          negative_prompt=args.negative_prompt,
                          max_sequence_length=(args.max_sequence_length
                                               or pipe.default_max_sequence_length),
                          frames=frames, sampler=args.sampler, video=video,
                          num_conditional_frames=args.num_conditional_frames)
        written = save_outputs(images, out, args.save_array, fps=pipe.default_fps)
    except (ValueError, FileNotFoundError, KeyError) as e:  # PipelineError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {' and '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
