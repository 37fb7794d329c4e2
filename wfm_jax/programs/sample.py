"""Sampling: `sample_program(setup)`, the trained model's sampler as a program over a Setup (RL
validation runs it, the planner can lower it), and for a loaded pipeline of any family the
prompt encoding, the sampler schedule and the whole text-to-image / text-to-video (and
video2world) generation, as one function the CLI, the shapes world's scoring and the tests
call."""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wfm_jax.core.mesh import mesh_jit, mesh_of
from wfm_jax.programs.encode import TextEncoder
from wfm_jax.programs.rl import pixels_to_uint8
from wfm_jax.programs.setup import Setup, make_velocity
from wfm_jax.sampling.dpm_solver import dpm_solver_flow_schedule
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import flow_sigmas, unipc_flow_schedule

# the deterministic flow samplers diffusers' pipelines run (dpm_solver: SANA's DPM-Solver++)
SAMPLERS = ("euler", "unipc", "dpm_solver")
# pipe -> {(model structure, mesh, sampler, steps, guidance): the jitted sample-and-decode}
_GENERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    graphdef, state = nnx.split(pipe.trainable_module())
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
    run = _generator(pipe, family, graphdef, vae_def, mesh_of(state), sampler, steps, guidance)
    return np.asarray(run(state, vae_state, latents, cond, uncond))


def _generator(pipe, family, graphdef, vae_def, mesh, sampler: str, steps: int, guidance: float):
    """The jitted sample-and-decode for one pipe and setting, kept while the pipe lives: calls
    in batches (tiny_eval's chunks, a user's loop) reuse its compiled program instead of
    tracing and compiling a new closure each time."""
    programs = _GENERATORS.setdefault(pipe, {})
    key = (graphdef, vae_def, mesh, sampler, steps, float(guidance))
    if key in programs:
        return programs[key]
    sigmas, timesteps = schedule(pipe, sampler, steps)

    @mesh_jit(mesh=mesh)
    def run(state, vae_state, x, cond, uncond):
        transformer = nnx.merge(graphdef, state)
        velocity = lambda x, t, c: family.velocity_with(transformer, x, t, c)
        out = sample(velocity, x, sigmas, method=sampler, cond=cond, uncond=uncond,
                     cfg_scale=guidance, timesteps=timesteps, guide=family.guide)
        return family.decode_with(nnx.merge(vae_def, vae_state), out.latents)

    programs[key] = run
    return run


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


def sample_program(setup: Setup, decode: bool = True):
    """jit((state, frozen, vae_state, latents, cond, uncond) -> (latents, uint8 pixels)):
    the family's deterministic sampler (as its diffusers pipeline samples: SD3 Euler; Wan and
    Cosmos UniPC; SANA DPM-Solver++, on the family's own noise range) with
    policy.diffusers.sample.eval_num_steps steps and guidance_scale, on the evaluation weights
    (the EMA when kept). uncond None: no CFG. The pixels are rounded to uint8 on the device, as
    the rollout's are: 4x fewer bytes to fetch, and the same decode program as the rollout's for
    the planner. decode False: the latents only (vae_state unused; the planner compiles the decode
    once, apart: decode_program)."""
    cfg = setup.config.policy.diffusers.sample
    family, graphdef = setup.pipe.shell(), setup.graphdef
    vae_def = nnx.graphdef(setup.pipe.vae)
    method = setup.pipe.default_solver
    sigmas, timesteps = setup.pipe.flow_schedule(int(cfg.eval_num_steps), method)
    sigmas = jnp.asarray(sigmas, jnp.float32)
    guidance = float(cfg.guidance_scale)
    rows = setup.batch_sharding()

    @mesh_jit(mesh=setup.mesh, rules=setup.rules, out_shardings=(rows, rows) if decode else rows)
    def evaluate(state, frozen, vae_state, latents, cond, uncond):
        params = state.params if state.ema is None else state.ema
        velocity = make_velocity(graphdef, frozen, family)
        out = sample(lambda x, t, c: velocity(params, x, t, c), latents, sigmas,
                     method=method, cond=cond, uncond=uncond, cfg_scale=guidance,
                     timesteps=timesteps, guide=family.guide)
        if not decode:
            return out.latents
        # the latents too: rewards of media_type "latent" score them
        return out.latents, pixels_to_uint8(family.decode_with(nnx.merge(vae_def, vae_state),
                                                               out.latents))

    return evaluate


def decode_program(setup: Setup, to_uint8: bool = False):
    """jit((vae_state, latents) -> pixels in [0, 1], or uint8 with to_uint8): the VAE decode
    that ends the sampler and the RL rollout, on its own. It does not depend on the
    transformer, so the planner compiles it once beside cut models of the rest."""
    family, vae_def = setup.pipe.shell(), nnx.graphdef(setup.pipe.vae)
    rows = setup.batch_sharding()

    @mesh_jit(mesh=setup.mesh, rules=setup.rules, out_shardings=rows)
    def decode(vae_state, latents):
        pixels = family.decode_with(nnx.merge(vae_def, vae_state), latents)
        return pixels_to_uint8(pixels) if to_uint8 else pixels

    return decode
