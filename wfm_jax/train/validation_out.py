"""Writing one validation step's samples: a captioned PNG grid for images (B, H, W, 3), a
captioned mp4 grid for videos (B, T, H, W, 3); each also logged to wandb when it is on. The RL
loop calls `write_validation` whatever the model family."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from wfm_jax.io.media import to_uint8, write_mp4
from wfm_jax.train.image_grid import captioned_grid, save_grid
from wfm_jax.train.video_grid import captioned_video_grid


def captions_for(prompts: Sequence[str], rewards) -> list[str]:
    return [f"{p} | {float(r):.4g}" for p, r in zip(prompts, np.asarray(rewards).reshape(-1))]


def write_validation(pixels, prompts: Sequence[str], rewards, out_dir: str, step: int, *,
                     fps: float = 16.0, logger=None) -> str:
    """pixels in [0, 1] (or uint8): (B, H, W, 3) -> out_dir/step_{step}.png, (B, T, H, W, 3) ->
    out_dir/step_{step}.mp4, each sample captioned "prompt | reward"; -> the path written.
    logger: a MetricsLogger, which sends it to wandb as val/images or val/videos."""
    pixels = to_uint8(pixels)
    if len(prompts) != pixels.shape[0] or np.size(rewards) != pixels.shape[0]:
        raise ValueError(f"{len(prompts)} prompts and {np.size(rewards)} rewards for "
                         f"{pixels.shape[0]} samples")
    captions = captions_for(prompts, rewards)
    if pixels.ndim == 4:
        path = save_grid(captioned_grid(pixels, captions),
                         os.path.join(out_dir, f"step_{step}.png"))
        if logger is not None:
            logger.log_image("val/images", path, caption=f"step {step}", step=step)
        return path
    if pixels.ndim == 5:
        path = write_mp4(os.path.join(out_dir, f"step_{step}.mp4"),
                         captioned_video_grid(pixels, captions), fps=fps)
        if logger is not None:
            logger.log_video("val/videos", path, caption=f"step {step}", step=step)
        return path
    raise ValueError(f"validation samples must be images (B, H, W, 3) or videos "
                     f"(B, T, H, W, 3), got {pixels.shape}")
