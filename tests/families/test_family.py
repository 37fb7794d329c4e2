"""The model-family interface (wfm_jax.families.base): registry lookup, one-line errors for an
unsupported pipeline class and for a checkpoint of another family than the recipe's, SD3 through
`load_pipeline` is `SD3Pipeline.load`, and a test-local video family proves the generic paths
(VAE encoding, reward media, generate with its own CFG form, mp4 output) take 5-D latents."""
from __future__ import annotations

import functools
import itertools
import json
import operator
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wfm_jax.families import FAMILIES
from wfm_jax.families import base as fam
from wfm_jax.families.base import PipelineError, PipelineFamily

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

FRAMES, SIZE = 5, 16


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)


def _index_dir(path, class_name: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model_index.json"), "w") as f:
        json.dump({"_class_name": class_name}, f)
    return str(path)


# ----------------------------------------------------------------------------- a fake video family

class _Gain(nnx.Module):
    def __init__(self, value: float):
        self.w = nnx.Param(jnp.asarray(value, jnp.float32))


class FakeVideo(PipelineFamily):
    """Linear stand-ins with Wan's geometry: latents (B, 2, (T - 1) / 4 + 1, H / 8, W / 8)."""
    pipeline_class = "FakeVideoPipeline"
    family = "fakevid"
    is_video = True
    default_frames, default_steps, default_guidance = FRAMES, 2, 3.0

    def __init__(self, directory: str):
        self.directory = directory
        self.transformer, self.vae, self.text_encoders = _Gain(0.5), _Gain(2.0), (_Gain(1.5),)
        self.transformer_config, self.vae_config = {"in_channels": 2}, {}
        self.scheduler_config = {"shift": 1.0}

    @classmethod
    def load(cls, directory, **options):
        return cls(directory)

    def latent_shape(self, batch, height, width, frames=None):
        if (frames - 1) % 4:
            raise ValueError(f"frames {frames} must be 4k + 1")
        return (batch, 2, (frames - 1) // 4 + 1, height // 8, width // 8)

    def tokenize(self, prompts, max_sequence_length):
        return {"ids": np.array([[len(p)] for p in prompts], np.int32)}

    def encode_text_with(self, text_encoders, ids, max_sequence_length):
        ids = jnp.asarray(ids["ids"], jnp.float32)
        return {"context": ids[:, :, None] * text_encoders[0].w[...]}

    def cond_from_embedding(self, embedding):
        return {"context": np.asarray(embedding["context"], np.float32)}

    def velocity_with(self, transformer, latents, timesteps, cond):
        return latents * transformer.w[...] + 0.01 * cond["context"][:, :, :, None, None]

    def guide(self, v_cond, v_uncond, scale):  # Cosmos' form, not diffusers'
        return v_cond + scale * (v_cond - v_uncond)

    def posterior_with(self, vae, pixels):
        b, t, h, w, _ = pixels.shape
        x = pixels[:, ::4].reshape(b, (t - 1) // 4 + 1, h // 8, 8, w // 8, 8, 3).mean((3, 5))
        mean = jnp.transpose(x, (0, 4, 1, 2, 3))[:, :2] * vae.w[...]
        return mean, jnp.full_like(mean, 0.1)

    def normalize_latents(self, z):
        return (z - 0.25) * 2.0

    def decode_with(self, vae, latents):
        return _decode(jnp, latents, vae.w[...])


def _decode(xp, latents, gain):
    """Latents -> clips (B, T, H, W, 3) in [0, 1], with numpy (the reference) or jax.numpy."""
    z = latents / 2.0 + 0.25
    frames = (latents.shape[2] - 1) * 4 + 1
    z = xp.repeat(xp.repeat(xp.repeat(z, 8, -1), 8, -2), 4, 2)[:, :, :frames]
    x = xp.concatenate([z, z.mean(1, keepdims=True)], axis=1) / gain
    return xp.clip(xp.transpose(x, (0, 2, 3, 4, 1)) / 2 + 0.5, 0.0, 1.0).astype(xp.float32)


@pytest.fixture
def fake_family():
    FAMILIES.register(FakeVideo.family, FakeVideo)
    yield FakeVideo
    FAMILIES.unregister(FakeVideo.family)


# ----------------------------------------------------------------------------- registry and errors

def test_registry_finds_sd3_by_model_index(tiny_dir):
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    assert fam.families()["sd3"] == "StableDiffusion3Pipeline"
    assert "StableDiffusion3Pipeline" in fam.supported_pipelines()
    assert fam.family_class(tiny_dir) is SD3Pipeline
    assert fam.family_named("sd3") is SD3Pipeline


def test_unsupported_class_is_one_line_naming_the_supported(tmp_path):
    path = _index_dir(tmp_path / "flux", "FluxPipeline")
    with pytest.raises(PipelineError) as e:
        fam.load_pipeline(path)
    msg = str(e.value)
    assert "\n" not in msg and "'FluxPipeline'" in msg and "StableDiffusion3Pipeline" in msg
    with pytest.raises(PipelineError, match="unknown model family 'nope'; known: .*sd3"):
        fam.family_named("nope")


def test_family_mismatch_is_one_line(tmp_path, tiny_dir, fake_family):
    video = _index_dir(tmp_path / "video", "FakeVideoPipeline")
    with pytest.raises(PipelineError) as e:
        fam.load_pipeline(video, family="sd3")
    assert str(e.value) == (f"{video} holds a FakeVideoPipeline ('fakevid' family) but the recipe "
                            f"is for the 'sd3' family (StableDiffusion3Pipeline)")
    with pytest.raises(PipelineError, match="holds a StableDiffusion3Pipeline .'sd3' family. but "
                                            "the recipe is for the 'fakevid' family"):
        fam.load_pipeline(tiny_dir, family="fakevid")
    assert isinstance(fam.load_pipeline(video, family="fakevid"), FakeVideo)


def test_train_setup_reports_a_mismatch_as_one_setup_error(tmp_path, fake_family):
    from wfm_jax.config.schema import default_config
    from wfm_jax.train import setup as setup_lib
    config = default_config()
    config.policy.model_name_or_path = _index_dir(tmp_path / "video", "FakeVideoPipeline")
    with pytest.raises(setup_lib.SetupError) as e:
        setup_lib.load_pipeline(config)
    msg = str(e.value)
    assert "\n" not in msg and "FakeVideoPipeline" in msg and "'sd3' family" in msg


def test_config_rejects_an_unknown_family():
    from wfm_jax.config.recipe import ConfigError, validate
    from wfm_jax.config.schema import default_config
    config = default_config()
    config.policy.family = "wan2"
    with pytest.raises(ConfigError, match=r"'policy.family' = 'wan2' is not one of \[.*'sd3'"):
        validate(config)


def test_is_video_must_match_the_family(fake_family):
    from wfm_jax.config.schema import default_config
    from wfm_jax.train import setup as setup_lib
    config = default_config()
    config.policy.diffusers.is_video = True
    with pytest.raises(setup_lib.SetupError, match="the 'sd3' family .* is an image model"):
        setup_lib.check_video_flag(config)
    config.policy.family = "fakevid"
    setup_lib.check_video_flag(config)
    config.policy.diffusers.is_video = False
    with pytest.raises(setup_lib.SetupError, match="is a video model"):
        setup_lib.check_video_flag(config)


def test_sd3_through_load_pipeline_is_sd3pipeline_load(tiny_dir):
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    a, b = fam.load_pipeline(tiny_dir, family="sd3"), SD3Pipeline.load(tiny_dir)
    assert type(a) is SD3Pipeline and a.static_key() == b.static_key()
    for x, y in [(a.transformer, b.transformer), (a.vae, b.vae),
                 (list(a.text_encoders), list(b.text_encoders))]:
        fx, fy = nnx.state(x).flat_state(), nnx.state(y).flat_state()
        assert [p for p, _ in fx] == [p for p, _ in fy]
        for (_, u), (_, v) in zip(fx, fy):
            np.testing.assert_array_equal(np.asarray(u.get_value()), np.asarray(v.get_value()))
    # the shell keeps configs and tokenizers, never weights (cached jits close over it)
    shell = a.shell()
    assert shell.transformer is None and shell.vae is None and shell.text_encoders == ()
    assert shell.static_key() == a.static_key() and a.transformer is not None


@pytest.mark.parametrize("clip_length", [None, 16])
def test_sd3_cond_shapes_are_what_its_encoders_give(tiny_dir, tmp_path, clip_length):
    """The planner compiles on cond_shapes: the prompt embedding is as long as the CLIP
    tokenizer pads (the released 77, or the shapes world's 16) plus T5's tokens."""
    from wfm_jax.families import tiny
    from wfm_jax.families.sd3.pipeline import SD3Pipeline
    from wfm_jax.programs.encode import TextEncoder
    directory = tiny_dir
    if clip_length is not None:
        directory = str(tmp_path / "short_clip")
        tiny.write_pipeline(directory, 0, clip_max_length=clip_length)
    pipe = SD3Pipeline.load(directory)
    encoded = TextEncoder(pipe, 8)(pipe.tokenize(["a photo of the cat"] * 2, 8))
    want = {k: tuple(v.shape) for k, v in encoded.items()}
    assert pipe.cond_shapes(2, 8) == pipe.shell().cond_shapes(2, 8) == want
    assert want["prompt_embeds"][1] == (clip_length or 77) + 8


# ----------------------------------------------------------------------------- generic 5-D paths

def test_visual_encoder_takes_clips(fake_family):
    from wfm_jax.programs.encode import VisualEncoder, per_sample_normal
    pipe = FakeVideo("")
    pixels = jax.random.uniform(jax.random.key(0), (2, FRAMES, SIZE, SIZE, 3), minval=-1, maxval=1)
    ids, key = jnp.array([3, 7], jnp.int32), jax.random.key(1)
    got = VisualEncoder(pipe)(pixels, key, ids)
    assert got.shape == pipe.latent_shape(2, SIZE, SIZE, frames=FRAMES)
    mean, std = pipe.posterior_with(pipe.vae, pixels)
    want = (mean + std * per_sample_normal(key, ids, mean.shape[1:]) - 0.25) * 2.0
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)


def test_visual_encoder_maps_uint8_clips_on_the_device(fake_family):
    # the loaders give uint8 (B, T, H, W, 3); the jit maps them to numpy's [-1, 1] floats
    from wfm_jax.data.media import to_signed_unit
    from wfm_jax.programs.encode import VisualEncoder, signed_unit
    pipe = FakeVideo("")
    raw = np.random.default_rng(0).integers(0, 256, (2, FRAMES, SIZE, SIZE, 3), dtype=np.uint8)
    ids, key = jnp.array([3, 7], jnp.int32), jax.random.key(1)
    # the mapping itself is exact: numpy's float32 bits, looked up inside a jit
    mapped = jax.jit(signed_unit)(raw)
    assert mapped.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(mapped), to_signed_unit(raw))
    # the two encoders are different XLA programs (a gather feeds the first), so their fusions
    # may round differently: CI's AVX2 host differs by 1 ulp; bound it at a few
    encoder = VisualEncoder(pipe)
    np.testing.assert_allclose(np.asarray(encoder(raw, key, ids)),
                               np.asarray(encoder(to_signed_unit(raw), key, ids)),
                               rtol=4e-7, atol=4e-7)


def test_reward_media_sends_clips_channels_first():
    from wfm_jax.train.reward_media import reward_media
    clips = np.random.default_rng(0).integers(0, 256, (2, FRAMES, 8, 8, 3), dtype=np.uint8)
    media, kind = reward_media("pixels", clips)
    assert kind == "video" and media.shape == (2, 3, FRAMES, 8, 8)
    np.testing.assert_array_equal(media[1, 2, 4], clips[1, 4, :, :, 2])
    images = clips[:, 0]
    media, kind = reward_media("pixels", images)
    assert kind == "image" and np.array_equal(media, images)
    with pytest.raises(ValueError, match=r"\(B, H, W, 3\) or \(B, T, H, W, 3\), got \(8, 8, 3\)"):
        reward_media("pixels", images[0])


def _euler_reference(pipe, prompts, latents, steps, scale):
    """Euler by hand with the family's linear velocity and Cosmos-form CFG."""
    from wfm_jax.sampling.schedule import flow_sigmas
    sigmas = flow_sigmas(steps, pipe.shift)[0].astype(np.float64)
    ctx = np.array([len(p) for p in prompts], np.float64)[:, None, None, None, None] * 1.5
    ctx_u = 0.0  # the empty negative prompt has length 0
    x = latents.astype(np.float64)
    for s, s_next in itertools.pairwise(sigmas):
        v_c, v_u = x * 0.5 + 0.01 * ctx, x * 0.5 + 0.01 * ctx_u
        x = x + (s_next - s) * (v_c + scale * (v_c - v_u))
    return _decode(np, x.astype(np.float32), 2.0)


def test_generate_runs_a_video_family_with_its_own_guidance(tmp_path, fake_family):
    from wfm_jax.cli import generate
    pipe = FakeVideo("")
    prompts = ["a", "a cat"]
    latents = np.asarray(jax.random.normal(jax.random.key(0), pipe.latent_shape(
        2, SIZE, SIZE, frames=FRAMES)))
    got = generate.generate(pipe, prompts, steps=2, guidance=3.0, height=SIZE, width=SIZE,
                            latents=latents, frames=FRAMES)
    assert got.shape == (2, FRAMES, SIZE, SIZE, 3)
    np.testing.assert_allclose(got, _euler_reference(pipe, prompts, latents, 2, 3.0), atol=1e-5)
    assert got.std() > 1e-3


def test_generate_cli_writes_mp4_and_the_clip_array(tmp_path, fake_family, capsys):
    from wfm_jax.cli import generate
    model = _index_dir(tmp_path / "video", "FakeVideoPipeline")
    out, arr = str(tmp_path / "clip.mp4"), str(tmp_path / "clip.npy")
    rc = generate.main(["--model", model, "--prompt", "a", "--prompt", "bb", "--height", "16",
                        "--width", "16", "--out", out, "--save-array", arr])
    assert rc == 0, capsys.readouterr().err
    pixels = np.load(arr)
    assert pixels.shape == (2, FRAMES, 16, 16, 3) and pixels.dtype == np.float32
    import cv2
    for path in (out, str(tmp_path / "clip_1.mp4")):
        cap = cv2.VideoCapture(path)
        n = 0
        while cap.read()[0]:
            n += 1
        cap.release()
        assert n == FRAMES, path
    rc = generate.main(["--model", model, "--prompt", "a", "--frames", "6", "--out", out])
    assert rc == 2 and capsys.readouterr().err.strip() == "error: frames 6 must be 4k + 1"


def test_generate_frames_on_an_image_family_is_one_line(tiny_dir, tmp_path, capsys):
    from wfm_jax.cli import generate
    rc = generate.main(["--model", tiny_dir, "--prompt", "x", "--frames", "5",
                        "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--frames applies to video families" in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("guidance", [1.0, 5.0])
def test_generate_cli_matches_diffusers_wan(tmp_path, guidance):
    # the same CLI that runs SD3 runs Wan: UniPC by default, one batched CFG forward
    from tests.families.wan.test_wan_pipeline import FRAMES as T
    from tests.families.wan.test_wan_pipeline import HEIGHT, MAX_LEN, PIPELINE_ATOL, WIDTH, _torch_pipeline
    from wfm_jax.cli import generate
    torch_pipe = _torch_pipeline()
    model = str(tmp_path / "wan")
    torch_pipe.save_pretrained(model)
    prompts, steps = ["a red cat", "the dog on a photo"], 3
    latents = np.random.default_rng(3).standard_normal(
        (2, 4, (T - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)).astype(np.float32)
    np.save(tmp_path / "init.npy", latents)
    import torch
    want = torch_pipe(prompts, negative_prompt="blue", height=HEIGHT, width=WIDTH, num_frames=T,
                      num_inference_steps=steps, guidance_scale=guidance,
                      latents=torch.from_numpy(latents), output_type="np",
                      max_sequence_length=MAX_LEN).frames
    rc = generate.main(["--model", model, *functools.reduce(operator.iadd, [["--prompt", p] for p in prompts], []),
                        "--negative-prompt", "blue", "--steps", str(steps), "--guidance",
                        str(guidance), "--height", str(HEIGHT), "--width", str(WIDTH),
                        "--frames", str(T), "--max-sequence-length", str(MAX_LEN),
                        "--latents", str(tmp_path / "init.npy"),
                        "--out", str(tmp_path / "w.mp4"), "--save-array", str(tmp_path / "w.npy")])
    assert rc == 0
    got = np.load(tmp_path / "w.npy")
    assert got.shape == want.shape == (2, T, HEIGHT, WIDTH, 3)
    assert np.abs(got - want).max() <= PIPELINE_ATOL
    assert os.path.isfile(tmp_path / "w.mp4") and os.path.isfile(tmp_path / "w_1.mp4")


def test_nft_rolls_out_with_unipc():
    # Wan's scheduler as NFT's rollout solver: its own sigmas, diffusers' truncated timesteps
    from wfm_jax.algorithms.nft.algorithm import NFT
    from wfm_jax.config.recipe import validate
    from wfm_jax.config.schema import default_config
    from wfm_jax.sampling.samplers import sample
    from wfm_jax.sampling.schedule import unipc_flow_schedule
    config = default_config()
    config.train.train_policy.type = "nft"
    config.policy.diffusers.sample.solver = "unipc"
    config.policy.diffusers.sample.num_steps = 4
    config.rollout.n_generation = 8
    validate(config)
    algo = NFT.from_recipe(config, 3.0)
    seen = []

    def velocity(params, x, t, cond):
        seen.append(t)
        return params * x + cond * t[:, None, None, None, None] / 1000.0

    latents = jax.random.normal(jax.random.key(0), (2, 2, 2, 2, 2))
    state = type("S", (), {"aux": {"old": jnp.float32(0.3)}})()
    cond = jnp.ones((2, 1, 1, 1, 1))
    got = algo.rollout(velocity, state, latents, cond, None)["x0"]
    sigmas, timesteps = unipc_flow_schedule(4, 3.0)
    want = sample(lambda x, t, c: velocity(0.3, x, t, c), latents, sigmas, method="unipc",
                  cond=cond, timesteps=timesteps).latents
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    euler = sample(lambda x, t, c: velocity(0.3, x, t, c), latents, algo.sigmas, method="euler",
                   cond=cond).latents
    assert np.abs(np.asarray(got) - np.asarray(euler)).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(algo.rollout_timesteps), timesteps)
    assert np.all(timesteps == np.floor(timesteps))
