"""WanPipeline as a model family: a tiny diffusers WanPipeline (video_models.md §4.2 sizes: UMT5,
DiT, VAE with non-trivial latents_mean/std, UniPC flow shift 3), saved with save_pretrained and
loaded through `load_pipeline`, must reproduce diffusers in fp32: prompt encoding (2e-5), the VAE
posterior (2e-5), decode with postprocess (1e-4) and the whole pipeline from given latents with
CFG off and on (1e-4), composed from the family interface and the UniPC sampler.
Sizes are non-square (16x32 px, 9 frames) so a swapped height/width shows.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from flax import nnx

from wfm_jax.families.base import PipelineError, families, family_class, load_pipeline
from wfm_jax.families.tiny import t5_tokenizer
from wfm_jax.families.wan.pipeline import WanPipeline as JaxWanPipeline
from wfm_jax.families.wan.pipeline import prompt_clean
from wfm_jax.models.options import ModelOptions
from wfm_jax.sampling.samplers import sample

ATOL = 2e-5          # module outputs (UMT5, the VAE encoder's moments)
PIPELINE_ATOL = 1e-4  # chunked decode and the whole pipeline (the bound)
MAX_LEN = 12
FRAMES, HEIGHT, WIDTH = 9, 16, 32
LATENTS_MEAN = [0.3, -0.2, 0.1, 0.5]
LATENTS_STD = [1.5, 0.7, 2.0, 1.2]
PROMPTS = ["a red cat", "  the  dog &amp; a\n cat ",
           "a photo of the red dog in the blue cat on a dog"]  # the last one is truncated


def _perturb(model: torch.nn.Module, seed: int, scale: float = 0.1, redraw: bool = True) -> None:
    """Move norm gains off 1 and biases off 0 (and with redraw, re-draw every other weight near
    0) so a swapped or dropped mapping shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            constant = p.numel() > 1 and float(p.std()) == 0.0
            if constant or redraw:
                base = float(p.flatten()[0]) if constant else 0.0
                p.copy_(base + scale * torch.randn(p.shape, generator=gen))


def _torch_pipeline() -> WanPipeline:
    tokenizer = t5_tokenizer()
    torch.manual_seed(0)
    text_encoder = transformers.UMT5EncoderModel(transformers.UMT5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False)).eval()
    _perturb(text_encoder, 1, redraw=False)  # its own init keeps activations O(1)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32).eval()
    _perturb(transformer, 2)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                           attn_scales=[], temperal_downsample=[False, True, True],
                           latents_mean=LATENTS_MEAN, latents_std=LATENTS_STD).eval()
    with torch.no_grad():  # RMS gains off 1 so a wrongly mapped gamma shows
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       scheduler=scheduler, transformer=transformer)


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    torch_pipe = _torch_pipeline()
    directory = str(tmp_path_factory.mktemp("wan") / "pipe")
    torch_pipe.save_pretrained(directory)
    return torch_pipe, load_pipeline(directory, family="wan"), directory


def test_load_pipeline_dispatches_to_wan(pipes):
    _, pipe, directory = pipes
    assert family_class(directory) is JaxWanPipeline and type(pipe) is JaxWanPipeline
    assert families()["wan"] == "WanPipeline" and JaxWanPipeline.is_video
    assert pipe.shift == 3.0 and pipe.default_solver == "unipc"
    assert hash(pipe.static_key()) == hash(JaxWanPipeline.load(directory).static_key())
    with pytest.raises(PipelineError, match=r"holds a WanPipeline \('wan' family\) but the "
                                            r"recipe is for the 'sd3' family"):
        load_pipeline(directory, family="sd3")


def test_load_options_reach_the_models(pipes):
    """bf16 compute with remat for the transformer, bf16 frozen weights: the options arrive,
    and the velocity stays within bf16 rounding of the fp32 one."""
    _, pipe, directory = pipes
    low = load_pipeline(directory, dtype=jnp.bfloat16, frozen_param_dtype=jnp.bfloat16,
                        text_dtype=jnp.bfloat16, options=ModelOptions(remat="full"))
    assert low.transformer.remat == "nothing_saveable" and low.transformer.dtype == jnp.bfloat16
    assert low.vae.decoder.conv_in.kernel[...].dtype == jnp.bfloat16
    assert low.text_encoders[0].shared[...].dtype == jnp.bfloat16
    z = jnp.asarray(np.random.default_rng(4).standard_normal(
        pipe.latent_shape(1, HEIGHT, WIDTH, FRAMES)), jnp.float32)
    t = jnp.array([700.0])
    want, got = (jax.jit(lambda z, t, p=p: p.velocity(z, t, p.encode_prompt(["a cat"], MAX_LEN)))(
        z, t) for p in (pipe, low))
    assert got.dtype == jnp.bfloat16
    rel = float(jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want))
    print(f"wan bf16 velocity relative error {rel:.3g}")
    assert rel <= 2e-2


def _edited_copy(directory, dst, **index_changes):
    shutil.copytree(directory, dst)
    path = os.path.join(dst, "model_index.json")
    with open(path) as f:
        info = json.load(f)
    info.update(index_changes)
    with open(path, "w") as f:
        json.dump({k: v for k, v in info.items() if v is not ...}, f)
    return str(dst)


def test_load_refuses_wan22_and_missing_components(pipes, tmp_path):
    _, _, directory = pipes
    wan22 = _edited_copy(directory, tmp_path / "wan22", boundary_ratio=0.875)
    with pytest.raises(PipelineError, match=r"boundary_ratio=0.875 \(Wan2.2\) is not supported"):
        load_pipeline(wan22)
    no_text = _edited_copy(directory, tmp_path / "no_text", text_encoder=...)
    with pytest.raises(PipelineError, match="lacks its 'text_encoder' component"):
        load_pipeline(no_text)


def test_prompt_clean_matches_diffusers():
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean as torch_clean
    for text in PROMPTS + ["&amp;lt;b&amp;gt;  x\u3000y\x1c z ", "\t\n"]:
        assert prompt_clean(text) == torch_clean(text)


def test_encode_prompt_matches_diffusers(pipes):
    torch_pipe, pipe, _ = pipes
    with torch.no_grad():
        want, _ = torch_pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False,
                                           max_sequence_length=MAX_LEN)
    # pipe.encode_prompt (= encode_text_with(text_encoders, tokenize(...))) under jit with the
    # weights as arguments (eager, each UMT5 op compiles on its own; as closed-over constants,
    # XLA folds them and the 1e-6 check below against the split-state jit moves by an ulp)
    encode = nnx.jit(lambda encoder, ids: pipe.encode_text_with((encoder,), ids, MAX_LEN))
    got = np.asarray(encode(pipe.text_encoders[0], pipe.tokenize(PROMPTS, MAX_LEN))[
        "encoder_hidden_states"])
    assert got.shape == tuple(want.shape) == (3, MAX_LEN, 16) and got.dtype == np.float32
    lens = pipe.tokenize(PROMPTS, MAX_LEN)["attention_mask"].sum(1)
    assert lens[0] < lens[1] < lens[2] == MAX_LEN  # padded by different amounts; truncated
    assert not got[0, lens[0]:].any() and np.abs(got[0, :lens[0]]).min() > 0
    # the jitted path trainers take: the encoder split into (graphdef, state), ids as arrays
    graphdef, state = nnx.split(pipe.text_encoders[0])
    ids = pipe.tokenize(PROMPTS, MAX_LEN)
    jitted = jax.jit(lambda st, ids: pipe.encode_text_with((nnx.merge(graphdef, st),), ids,
                                                           MAX_LEN))(state, ids)
    np.testing.assert_allclose(np.asarray(jitted["encoder_hidden_states"]), got, atol=1e-6)
    err = float(np.max(np.abs(got - want.numpy())))
    print(f"wan encode_prompt max abs err {err:.3g} (max |x| {np.abs(got).max():.3g})")
    assert err <= ATOL


def test_cond_from_embedding(pipes):
    _, pipe, _ = pipes
    emb = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float16)
    for given in (emb, {"encoder_hidden_states": emb}, {"umt5_xxl": emb}):
        cond = pipe.cond_from_embedding(given)
        assert cond["encoder_hidden_states"].dtype == np.float32
        np.testing.assert_array_equal(cond["encoder_hidden_states"], emb.astype(np.float32))
    with pytest.raises(ValueError, match=r"hold 'encoder_hidden_states'; got keys \['a', 'b'\]"):
        pipe.cond_from_embedding({"a": emb, "b": emb})
    with pytest.raises(ValueError, match=r"\(batch, tokens, 16\); got \(2, 5, 8\)"):
        pipe.cond_from_embedding(emb[..., :8])


def test_latent_shape_and_bad_sizes(pipes):
    torch_pipe, pipe, _ = pipes
    shape = pipe.latent_shape(2, HEIGHT, WIDTH, FRAMES)
    want = torch_pipe.prepare_latents(2, 4, HEIGHT, WIDTH, FRAMES, torch.float32, "cpu",
                                      torch.Generator().manual_seed(0)).shape
    assert shape == tuple(want) == (2, 4, 3, 2, 4)
    assert pipe.latent_shape(1, 32, 16, 1) == (1, 4, 1, 4, 2)
    with pytest.raises(ValueError, match=r"Wan takes 4k\+1 frames .* got 10$"):
        pipe.latent_shape(1, HEIGHT, WIDTH, 10)
    with pytest.raises(ValueError, match="got None"):
        pipe.latent_shape(1, HEIGHT, WIDTH)
    with pytest.raises(ValueError, match=r"height 24 and width 32 must be positive multiples of "
                                         r"16 and 16 \(VAE factor 8 x patch size 2, 2\)"):
        pipe.latent_shape(1, 24, WIDTH, FRAMES)
    with pytest.raises(ValueError, match=r"patch grid \(1, 1, 33\); .* at most 32"):
        pipe.latent_shape(1, 16, 16 * 33, 1)


def test_posterior_and_normalisation_match_diffusers(pipes):
    torch_pipe, pipe, _ = pipes
    pixels = np.random.default_rng(1).uniform(-1, 1, (1, FRAMES, HEIGHT, WIDTH, 3))
    pixels = pixels.astype(np.float32)
    with torch.no_grad():
        dist = torch_pipe.vae.encode(torch.from_numpy(pixels).permute(0, 4, 1, 2, 3)).latent_dist
    mean, std = jax.jit(lambda x: pipe.posterior_with(pipe.vae, x))(jnp.asarray(pixels))
    assert mean.shape == pipe.latent_shape(1, HEIGHT, WIDTH, FRAMES)
    err = max(float(np.max(np.abs(np.asarray(mean) - dist.mean.numpy()))),
              float(np.max(np.abs(np.asarray(std) - dist.std.numpy()))))
    print(f"wan posterior max abs err {err:.3g}")
    assert err <= ATOL
    # diffusers' Wan training scripts: (z - latents_mean) * (1 / latents_std)
    m = torch.tensor(LATENTS_MEAN).view(1, 4, 1, 1, 1)
    inv = 1.0 / torch.tensor(LATENTS_STD).view(1, 4, 1, 1, 1)
    want = ((dist.mean - m) * inv).numpy()
    got = np.asarray(pipe.normalize_latents(mean))
    assert float(np.max(np.abs(got - want))) <= ATOL
    with pytest.raises(ValueError, match=r"\(batch, frames, height, width, 3\); got "
                                         r"\(1, 16, 32, 3\)"):
        pipe.posterior_with(pipe.vae, jnp.asarray(pixels[:, 0]))


def _diffusers_decode(torch_pipe, latents: np.ndarray) -> np.ndarray:
    """WanPipeline.__call__'s tail, verbatim: de-normalise, decode, postprocess to np."""
    vae = torch_pipe.vae
    x = torch.from_numpy(latents)
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(x / inv_std + mean, return_dict=False)[0]
    return torch_pipe.video_processor.postprocess_video(video, output_type="np")


def test_decode_matches_diffusers(pipes):
    torch_pipe, pipe, _ = pipes
    latents = 2.0 * np.random.default_rng(2).standard_normal(
        pipe.latent_shape(2, HEIGHT, WIDTH, FRAMES)).astype(np.float32)
    want = _diffusers_decode(torch_pipe, latents)
    got = np.asarray(jax.jit(lambda z: pipe.decode(z))(jnp.asarray(latents)))
    assert got.shape == want.shape == (2, FRAMES, HEIGHT, WIDTH, 3)
    assert got.min() == 0.0 or got.max() == 1.0  # the clamp is exercised
    err = float(np.max(np.abs(got - want)))
    print(f"wan decode max abs err {err:.3g}")
    assert err <= PIPELINE_ATOL


def _jax_generate(pipe, prompts, negative, latents, steps, guidance):
    """The family interface composed with the UniPC sampler: diffusers' two forwards per step
    (cond, then uncond) combined by `pipe.guide`, CFG only when guidance > 1 (as diffusers)."""
    cond = pipe.encode_prompt(prompts, MAX_LEN)
    cfg = guidance > 1
    if cfg:
        uncond = pipe.encode_prompt([negative] * len(prompts), MAX_LEN)
    sigmas, timesteps = pipe.sampler_schedule(steps)

    def velocity(x, t, c):
        v = pipe.velocity(x, t, c["cond"]).astype(jnp.float32)
        if cfg:
            v = pipe.guide(v, pipe.velocity(x, t, c["uncond"]).astype(jnp.float32), guidance)
        return v

    @jax.jit
    def run(x, c):
        out = sample(velocity, x, sigmas, method=pipe.default_solver, cond=c,
                     timesteps=timesteps)
        return pipe.decode(out.latents)

    return np.asarray(run(jnp.asarray(latents), dict(cond=cond, uncond=uncond if cfg else None)))


@pytest.mark.parametrize("guidance", [1.0, 5.0])
def test_pipeline_matches_diffusers(pipes, guidance):
    torch_pipe, pipe, _ = pipes
    prompts, negative, steps = ["a red cat", "the dog on a photo"], "blue", 3
    latents = np.random.default_rng(3).standard_normal(
        pipe.latent_shape(2, HEIGHT, WIDTH, FRAMES)).astype(np.float32)
    want = torch_pipe(prompts, negative_prompt=negative, height=HEIGHT, width=WIDTH,
                      num_frames=FRAMES, num_inference_steps=steps, guidance_scale=guidance,
                      latents=torch.from_numpy(latents), output_type="np",
                      max_sequence_length=MAX_LEN).frames
    got = _jax_generate(pipe, prompts, negative, latents, steps, guidance)
    assert got.shape == want.shape == (2, FRAMES, HEIGHT, WIDTH, 3)
    err = float(np.max(np.abs(got - want)))
    print(f"wan pipeline guidance={guidance} max abs err {err:.3g}")
    assert err <= PIPELINE_ATOL
