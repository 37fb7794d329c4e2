"""Text-to-image with a local diffusers SD3 pipeline, in JAX.

    python -m wfm_jax.generate --model DIR --prompt "a cat" --steps 28 --guidance 4.5 \
        --height 512 --width 512 --seed 0 --out cat.png [--latents init.npy] [--save-array x.npy]

`--latents` takes initial latents in diffusers layout (B, C, h, w), so a diffusers run can be
reproduced exactly; `--save-array` writes float pixels (B, H, W, C) in [0, 1] like diffusers'
`output_type="np"`. Several prompts are laid out as a grid in the PNG.
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
from wfm_jax.models.sd3.pipeline import SD3Pipeline, decode_latents
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import flow_sigmas
from wfm_jax.train.encode import TextEncoder


def encode_prompts(pipe, prompts: Sequence[str], max_sequence_length: int):
    encoder = TextEncoder(pipe, max_sequence_length)
    return encoder({k: jnp.asarray(v) for k, v in encoder.tokenize(prompts).items()})


def generate(pipe, prompts: Sequence[str], *, steps: int, guidance: float, height: int, width: int,
             seed: int = 0, latents=None, negative_prompt: str = "",
             max_sequence_length: int = 256) -> np.ndarray:
    """Pixels (B, H, W, 3) float32 in [0, 1] for `prompts`, as StableDiffusion3Pipeline gives."""
    shape = pipe.latent_shape(len(prompts), height, width)
    if latents is None:
        latents = jax.random.normal(jax.random.key(seed), shape, jnp.float32)
    elif tuple(latents.shape) != shape:
        raise ValueError(f"--latents has shape {tuple(latents.shape)}; expected {shape} "
                         f"(B, C, h, w) for {len(prompts)} prompt(s) at {height}x{width}")
    embeds, pooled = encode_prompts(pipe, prompts, max_sequence_length)
    cond = {"prompt_embeds": embeds, "pooled_projections": pooled}
    uncond = None
    if guidance > 1:  # diffusers: do_classifier_free_guidance = guidance_scale > 1
        neg_embeds, neg_pooled = encode_prompts(pipe, [negative_prompt] * len(prompts),
                                                max_sequence_length)
        uncond = {"prompt_embeds": neg_embeds, "pooled_projections": neg_pooled}
    sigmas, _ = flow_sigmas(steps, pipe.shift)

    graphdef, state = nnx.split(pipe.transformer)
    vae_def, vae_state = nnx.split(pipe.vae)

    @mesh_jit(mesh=mesh_of(state))
    def run(state, vae_state, x, cond, uncond):
        transformer = nnx.merge(graphdef, state)
        velocity = lambda x, t, c: transformer(x, c["prompt_embeds"], c["pooled_projections"], t)
        out = sample(velocity, x, sigmas, method="euler", cond=cond, uncond=uncond,
                     cfg_scale=guidance)
        pipe_vae = nnx.merge(vae_def, vae_state)
        return decode_latents(pipe_vae, pipe.vae_config, out.latents)

    return np.asarray(run(state, vae_state, jnp.asarray(latents, jnp.float32), cond, uncond))


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


def save_outputs(images: np.ndarray, out: str | None, save_array: str | None) -> None:
    from PIL import Image
    for path in (out, save_array):
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    if save_array:
        tmp = save_array + ".tmp.npy"
        np.save(tmp, images.astype(np.float32))
        os.replace(tmp, save_array)
    if out:
        tmp = out + ".tmp.png"
        Image.fromarray(to_grid(images)).save(tmp, format="PNG")
        os.replace(tmp, out)


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
    p.add_argument("--model", required=True, help="local diffusers StableDiffusion3Pipeline dir")
    p.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    p.add_argument("--prompts-file", help="one prompt per line")
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--guidance", type=float, default=4.5)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-sequence-length", type=int, default=256)
    p.add_argument("--latents", help=".npy initial latents (B, C, h, w), diffusers layout")
    p.add_argument("--out", default="out.png")
    p.add_argument("--save-array", help=".npy path for float pixels (B, H, W, C) in [0, 1]")
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
        pipe = SD3Pipeline.load(args.model)
        pipe.latent_shape(len(prompts), args.height, args.width)  # fail before compiling
        images = generate(pipe, prompts, steps=args.steps, guidance=args.guidance,
                          height=args.height, width=args.width, seed=args.seed, latents=latents,
                          negative_prompt=args.negative_prompt,
                          max_sequence_length=args.max_sequence_length)
        save_outputs(images, args.out, args.save_array)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}" + (f" and {args.save_array}" if args.save_array else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
