"""The Cosmos2_5_PredictBasePipeline family against diffusers' own pipeline on the tiny Cosmos
dir (wfm_jax.families.cosmos.tiny): the prompt embedding, whole text2world and video2world runs (1 and 2
conditional latent frames, CFG off and on) from the same initial latents, the scheduler's
sigmas; the conditioning entries through jax.jit and guided_velocity; geometry and embedding
errors; load_pipeline dispatch.

diffusers' pipeline needs a safety checker object (cosmos_guardrail is not installed): a stand-in
that passes every prompt is given, as spec video_models.md §4.1 says; its transformer's padding
mask resize needs torchvision, shimmed exactly (F.interpolate nearest) as the transformer test.
"""
from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wfm_jax.families import tiny
from wfm_jax.families.base import PipelineError, load_pipeline
from wfm_jax.families.cosmos import tiny as tiny_cosmos
from wfm_jax.families.cosmos.pipeline import CosmosPipeline, karras_flow_sigmas
from wfm_jax.programs.sample import generate
from wfm_jax.sampling.guidance import guided_velocity

PROMPTS = ["a photo of the cat", "the red car on the road"]
MAX_LEN = 128  # the tiny Qwen's max_position_embeddings; the templated prompts fit
FRAMES, H, W = tiny_cosmos.FRAMES, tiny_cosmos.HEIGHT, tiny_cosmos.WIDTH
ATOL = 1e-4  # whole pipeline
EMBED_ATOL = 2e-5


class PassingSafetyChecker:
    """What diffusers' __call__ needs of a safety checker, passing everything."""

    def to(self, *args, **kwargs):
        return self

    def check_text_safety(self, prompt):
        return True


@pytest.fixture(scope="module")
def cosmos_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny_cosmos") / "pipe"),
                                    family="cosmos")


@pytest.fixture(scope="module")
def torch_pipe(cosmos_dir):
    from diffusers import Cosmos2_5_PredictBasePipeline
    from diffusers.models.transformers import transformer_cosmos
    transformer_cosmos.transforms = SimpleNamespace(
        functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                                   F.interpolate(img, size=size, mode="nearest")),
        InterpolationMode=SimpleNamespace(NEAREST="nearest"))
    return Cosmos2_5_PredictBasePipeline.from_pretrained(cosmos_dir,
                                                         safety_checker=PassingSafetyChecker())


@pytest.fixture(scope="module")
def pipe(cosmos_dir):
    return load_pipeline(cosmos_dir, family="cosmos")


def _latents(batch, seed=0):
    shape = (batch, 4, (FRAMES - 1) // 4 + 1, H // 8, W // 8)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_dispatch_defaults_and_family_mismatch(cosmos_dir, pipe):
    assert isinstance(pipe, CosmosPipeline) and pipe.is_video
    assert (pipe.default_steps, pipe.default_guidance, pipe.default_frames,
            pipe.default_max_sequence_length) == (36, 7.0, 93, 512)
    assert pipe.default_solver == "unipc" and pipe.supports_video_condition
    with pytest.raises(PipelineError, match=r"holds a Cosmos2_5_PredictBasePipeline \('cosmos' "
                                            r"family\) but the recipe is for the 'wan' family"):
        load_pipeline(cosmos_dir, family="wan")


def test_schedule_is_the_schedulers(torch_pipe, pipe):
    for steps in (2, 10, 36):
        torch_pipe.scheduler.set_timesteps(steps)
        sigmas, timesteps = pipe.sampler_schedule(steps)
        np.testing.assert_array_equal(sigmas, torch_pipe.scheduler.sigmas.numpy())
        np.testing.assert_allclose(timesteps / 1000, sigmas[:-1], rtol=1e-6)
    np.testing.assert_allclose(karras_flow_sigmas(10, 0.01, 200.0),  # spec §1.1, measured
                               [.995, .9908, .9822, .9631, .9189, .8143, .594, .2845, .0742,
                                .0099, 0], atol=6e-5)


@pytest.fixture(scope="module")
def encode_prompt(pipe):
    """pipe.encode_prompt under one jit the tests share (eager, every text-encoder op compiles
    on its own); tokenising stays on the host."""
    run = jax.jit(lambda ids: pipe.encode_text_with(pipe.text_encoders, ids, MAX_LEN))
    return lambda prompts: run(pipe.tokenize(prompts, MAX_LEN))


def test_prompt_embedding_matches_diffusers(torch_pipe, pipe, encode_prompt):
    with torch.no_grad():
        want, _ = torch_pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False,
                                           max_sequence_length=MAX_LEN, dtype=torch.float32)
    got = encode_prompt(PROMPTS)["encoder_hidden_states"]
    assert got.shape == tuple(want.shape) == (2, MAX_LEN, tiny_cosmos.TEXT_WIDTH)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=EMBED_ATOL, rtol=0)


CASES = {  # name: (batch, guidance, conditional latent frames or None for text2world)
    "t2w": (2, 1.0, None),
    "t2w-cfg": (2, 3.0, None),
    "v2w1-cfg": (1, 3.0, 1),
    "v2w2": (1, 1.0, 2),
    "v2w2-cfg": (1, 3.0, 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_whole_pipeline_matches_diffusers(torch_pipe, pipe, case):
    batch, guidance, cond_frames = CASES[case]
    latents = _latents(batch)
    video = None
    if cond_frames:  # 7 frames: the last 1 or 5 are taken, as diffusers does
        video = np.random.default_rng(3).uniform(0, 1, (7, H, W, 3)).astype(np.float32)
    kwargs = {}
    if video is not None:
        kwargs = dict(video=torch.from_numpy(video * 2 - 1).permute(3, 0, 1, 2)[None],
                      num_latent_conditional_frames=cond_frames)
    with torch.no_grad():
        want = torch_pipe(prompt=PROMPTS[:batch], height=H, width=W, num_frames=FRAMES,
                          num_inference_steps=3, guidance_scale=guidance,
                          latents=torch.from_numpy(latents), output_type="np",
                          max_sequence_length=MAX_LEN, **kwargs).frames
    got = generate(pipe, PROMPTS[:batch], steps=3, guidance=guidance, height=H, width=W,
                   latents=latents, max_sequence_length=MAX_LEN, frames=FRAMES, video=video,
                   num_conditional_frames=cond_frames or 2)
    assert got.shape == want.shape == (batch, FRAMES, H, W, 3)
    err = float(np.max(np.abs(got - want)))
    print(f"{case}: max abs err {err:.3g}")
    assert err <= ATOL


def test_conditioned_frames_through_jit_and_guided_velocity(pipe, encode_prompt):
    """A cond dict with conditional frames is a plain pytree: jitted guided_velocity keeps the
    conditioned frames at the given velocity (or (x - c) / sigma without one) and guides the
    rest in Cosmos' form (scale traced: 0 gives v_c alone)."""
    from flax import nnx
    b = 2
    x = jnp.asarray(_latents(b, seed=1))
    c = jnp.asarray(_latents(b, seed=2))
    mask = jnp.zeros((b, 1, x.shape[2], 1, 1)).at[:, :, :1].set(1.0)
    text = encode_prompt(PROMPTS)
    neg = encode_prompt(["", ""])
    frames = {"cond_latents": c, "cond_mask": mask}
    graphdef, state = nnx.split(pipe.transformer)
    family = pipe.shell()
    t = jnp.full((b,), 600.0)

    @jax.jit
    def run(state, cond, uncond, scale):
        model = nnx.merge(graphdef, state)
        fn = lambda x, t, c: family.velocity_with(model, x, t, c)
        return guided_velocity(fn, x, t, cond, uncond, scale, guide=family.guide)

    cond, uncond = {**text, **frames}, {**neg, **frames}
    v = run(state, cond, uncond, jnp.float32(3.0))
    v_c = run(state, cond, uncond, jnp.float32(0.0))
    v_u = run(state, uncond, cond, jnp.float32(0.0))
    np.testing.assert_allclose(v[:, :, :1], (x - c)[:, :, :1] / 0.6, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, v_c + 3.0 * (v_c - v_u), rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(v_c[:, :, 1:] - v_u[:, :, 1:]))) > 1e-3  # text matters
    given = {"cond_velocity": jnp.ones_like(x)}
    v = run(state, {**cond, **given}, {**uncond, **given}, jnp.float32(3.0))
    np.testing.assert_allclose(v[:, :, :1], 1.0, atol=1e-6)


def test_latent_shape_and_errors(pipe):
    assert pipe.latent_shape(2, 32, 48, frames=9) == (2, 4, 3, 4, 6)
    for kwargs, match in (
            (dict(height=32, width=32, frames=8), r"Cosmos takes 4k\+1 frames .*; got 8"),
            (dict(height=32, width=32, frames=None), r"4k\+1 frames .*; got None"),
            (dict(height=24, width=32, frames=9), r"height 24 and width 32 must be positive "
                                                  r"multiples of 16 and 16"),
            (dict(height=32, width=17 * 16, frames=9),
             r"patch grid \(3, 2, 17\); .*covers at most 16 per axis")):
        with pytest.raises(ValueError, match=match):
            pipe.latent_shape(1, **kwargs)


def test_cond_from_embedding(pipe):
    emb = np.random.default_rng(0).standard_normal((2, 5, tiny_cosmos.TEXT_WIDTH))
    got = pipe.cond_from_embedding(emb)["encoder_hidden_states"]
    assert got.dtype == np.float32 and got.shape == (2, 5, tiny_cosmos.TEXT_WIDTH)
    assert pipe.cond_from_embedding({"x": emb[0]})["encoder_hidden_states"].shape == (1, 5, 64)
    with pytest.raises(ValueError, match=r"must be \(batch, tokens, 64\) \(the transformer's "
                                         r"text input width\); got \(2, 5, 32\)"):
        pipe.cond_from_embedding(emb[..., :32])
    with pytest.raises(ValueError, match="got keys"):
        pipe.cond_from_embedding({"a": emb, "b": emb})


def test_generate_cli_video_errors(cosmos_dir, tmp_path, capsys):
    from wfm_jax.cli.generate import main
    short = tmp_path / "short.npy"
    np.save(short, np.zeros((3, H, W, 3), np.float32))
    base = ["--model", cosmos_dir, "--prompt", "a cat", "--height", str(H), "--width", str(W),
            "--frames", str(FRAMES), "--steps", "1", "--max-sequence-length", str(MAX_LEN)]
    assert main(base + ["--video", str(short), "--num-conditional-frames", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: the conditioning video has 3 frames; 2 conditional latent frames "
                   "need 5"]
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((5, H, W + 16, 3), np.float32))
    assert main(base + ["--video", str(wrong)]) == 2
    assert "must be (batch, frames, 32, 32, 3) (the output's size)" in capsys.readouterr().err


def test_video_input_mp4_and_a_family_without_the_capability(tmp_path, capsys):
    from wfm_jax.cli.generate import main, read_video
    from wfm_jax.io.media import write_mp4
    clip = np.random.default_rng(0).uniform(0, 1, (5, H, W, 3)).astype(np.float32)
    frames = read_video(write_mp4(str(tmp_path / "clip.mp4"), clip))
    assert frames.shape == clip.shape and frames.dtype == np.float32
    assert frames.min() >= 0 and frames.max() <= 1
    assert np.abs(frames - clip).mean() < 0.25  # lossy, but these frames
    wan = tiny.build_tiny_pipeline(str(tmp_path / "wan"), family="wan")
    assert main(["--model", wan, "--prompt", "a cat", "--height", str(H), "--width", str(W),
                 "--frames", str(FRAMES), "--video", str(tmp_path / "clip.mp4")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --video: a WanPipeline cannot condition on a video (no family capability "
        "supports_video_condition)"]
