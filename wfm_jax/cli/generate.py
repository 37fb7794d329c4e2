"""Text-to-image / text-to-video with a local diffusers pipeline, or answers from a Qwen3-VL model.

    python -m wfm_jax.generate --model DIR --prompt "a cat" --steps 28 --guidance 4.5 \
        --height 512 --width 512 --seed 0 --out cat.png [--latents init.npy] [--save-array x.npy]
    python -m wfm_jax.generate --model WAN_DIR --prompt "a cat" --frames 17 --out cat.mp4
    python -m wfm_jax.generate --model COSMOS_DIR --prompt "a cat" --video cond.mp4 \
        --num-conditional-frames 2 --out cat.mp4      (video2world: families that support it)

The family comes from the dir's model_index.json (wfm_jax.families.FAMILIES); --steps, --guidance,
--sampler, --max-sequence-length and --frames default to the family's (diffusers' pipeline
defaults). `--latents` takes initial latents in diffusers layout ((B, C, h, w), or
(B, C, T', h, w) for video), so a diffusers run can be reproduced exactly; `--save-array` writes
float pixels (B, H, W, C) or (B, T, H, W, C) in [0, 1] like diffusers' `output_type="np"`.
Several prompts are laid out as a grid in the PNG (images) or one .mp4 per prompt (video: the
first at --out, the others at OUT_1.mp4, ...). `--video` (.mp4, or .npy frames (T, H, W, 3) in
[0, 1], at --height x --width) conditions every prompt on its last frames, for families with
`supports_video_condition` (their `condition_from_video`).

A Qwen3-VL model dir (config.json, model_type qwen3_vl) answers questions instead (wfm_jax/cli/vlm.py):
    python -m wfm_jax.generate --model VLM_DIR --image cat.png --prompt "What is this?" \
        --max-new-tokens 64 [--temperature 0.7 --top-p 0.9 --top-k 50] [--save-array ids.npy]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from wfm_jax.cli import vlm
from wfm_jax.core import xla_flags
from wfm_jax.families.base import load_pipeline
from wfm_jax.programs.sample import SAMPLERS, generate


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
        raise ValueError(f"cannot read --video {path}: {e}") from None
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

    from wfm_jax.io.media import write_mp4
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
            raise ValueError(f"cannot read prompts file {args.prompts_file}: {e.strerror}") from None
    if not prompts:
        raise ValueError("give at least one --prompt or a non-empty --prompts-file")
    return prompts


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.generate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   help="local diffusers pipeline dir of a supported family (model_index.json), "
                        "or a Qwen3-VL model dir (config.json)")
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
                                   ".npy frames (T, H, W, 3) in [0, 1], at --height x --width; "
                                   "Qwen3-VL: a video file to ask about")
    p.add_argument("--num-conditional-frames", type=int, default=2, choices=(1, 2),
                   help="latent frames of --video to condition on (its last 1 or 5 frames)")
    p.add_argument("--out", help="PNG grid (images) or .mp4 (video); default out.png / out.mp4")
    p.add_argument("--save-array", help=".npy path for float pixels (B, [T,] H, W, C) in [0, 1]; "
                                        "Qwen3-VL: the generated token ids (B, T) int32")
    vlm.add_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    xla_flags.apply()  # before jax starts its backend
    try:
        prompts = read_prompts(args)
        kind = vlm.model_kind(args.model)
        vlm.check_flags(args, kind)
        if kind == "vlm":
            return vlm.run(args, prompts)
        latents = None
        if args.latents:
            try:
                latents = np.load(args.latents)
            except (OSError, ValueError) as e:
                raise ValueError(f"cannot read --latents {args.latents}: {e}") from None
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
