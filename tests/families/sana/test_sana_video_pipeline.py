"""SanaVideoPipeline as a model family: the tiny pipeline (wfm_jax.families.sana.tiny: spec §4.3's DiT,
the tiny Wan VAE with non-trivial latents_mean/std, flow shift 8) loaded by diffusers and by
`load_pipeline` must agree in fp32: prompt encoding with the video instruction (2e-5), the
latent normalisation (2e-5), and the whole pipeline from given latents with CFG off and on
(1e-4) at the requested frame count, through the generic `generate`. Exports: full fine-tune
and LoRA, as for images."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from converters.loading import load_model
from wfm_jax.families import tiny
from wfm_jax.families.base import load_pipeline
from wfm_jax.families.sana.pipeline import MASK_KEY, TEXT_KEY
from wfm_jax.families.sana.video_pipeline import VIDEO_INSTRUCTION, SanaVideoPipeline
from wfm_jax.models import lora as lora_lib
from wfm_jax.programs.sample import generate
from wfm_jax.train.export import LORA_WEIGHT_NAME, export_full_pipeline, export_lora

ATOL, PIPELINE_ATOL = 2e-5, 1e-4
MAX_LEN = 12
PROMPTS = ["A cat sleeping", "  a busy city street with red flowers and a bus by the sea  "]
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0")  # spec §5.3


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("sana_video") / "pipe"),
                                    family="sana_video")


@pytest.fixture(scope="module")
def torch_pipe(video_dir):
    from diffusers import SanaVideoPipeline as TorchSanaVideo
    return TorchSanaVideo.from_pretrained(video_dir)


@pytest.fixture(scope="module")
def pipe(video_dir):
    return load_pipeline(video_dir)


@pytest.fixture(scope="module")
def encode_text(pipe):
    """encode_text_with under one jit the tests share (one compile per token layout; eager,
    every Gemma2 op compiles on its own)."""
    return jax.jit(lambda ids: pipe.encode_text_with(pipe.text_encoders, ids, MAX_LEN))


def test_load_pipeline_dispatch_and_defaults(video_dir, pipe):
    assert type(pipe) is SanaVideoPipeline and pipe.is_video and pipe.family == "sana_video"
    assert pipe.instruction == VIDEO_INSTRUCTION
    assert (pipe.default_steps, pipe.default_guidance, pipe.default_frames) == (50, 6.0, 81)
    assert pipe.shift == 8.0
    assert type(load_pipeline(video_dir, family="sana_video")) is SanaVideoPipeline


def test_refuses_the_ltx2_vae(video_dir, tmp_path):
    import shutil

    from wfm_jax.families.base import PipelineError
    other = tmp_path / "p720"
    shutil.copytree(video_dir, other)
    index = json.loads((other / "model_index.json").read_text())
    index["vae"] = ["diffusers", "AutoencoderKLLTX2Video"]
    (other / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineError, match="AutoencoderKLLTX2Video VAE is not supported"):
        load_pipeline(str(other))


def test_prompt_encoding_matches_encode_prompt(torch_pipe, pipe, encode_text):
    with torch.no_grad():
        want, want_mask, neg, neg_mask = torch_pipe.encode_prompt(
            PROMPTS, do_classifier_free_guidance=True, negative_prompt="", device="cpu",
            max_sequence_length=MAX_LEN, complex_human_instruction=list(VIDEO_INSTRUCTION))
    got = encode_text(pipe.tokenize(PROMPTS, MAX_LEN))  # = pipe.encode_prompt, jitted
    np.testing.assert_array_equal(np.asarray(got[MASK_KEY]), want_mask.numpy())
    np.testing.assert_allclose(np.asarray(got[TEXT_KEY]), want.numpy(), rtol=0, atol=ATOL)
    got = encode_text(pipe.tokenize(["", ""], MAX_LEN, instruction=()))
    np.testing.assert_array_equal(np.asarray(got[MASK_KEY]), neg_mask.numpy())
    np.testing.assert_allclose(np.asarray(got[TEXT_KEY]), neg.numpy(), rtol=0, atol=ATOL)


def test_latent_normalisation_matches_diffusers(torch_pipe, pipe):
    """encode_visual = (posterior mean - latents_mean) / latents_std (cosmos-rl's
    visual_embedding); its inverse is what SanaVideoPipeline feeds the VAE decode."""
    video = np.random.default_rng(0).uniform(-1, 1, (1, 5, 32, 32, 3)).astype(np.float32)
    cfg = torch_pipe.vae.config
    with torch.no_grad():
        mean = torch_pipe.vae.encode(torch.from_numpy(video).permute(0, 4, 1, 2, 3)
                                     ).latent_dist.mean.numpy()
    stats = [np.asarray(v, np.float32).reshape(1, -1, 1, 1, 1)
             for v in (cfg.latents_mean, cfg.latents_std)]
    want = (mean - stats[0]) / stats[1]
    got = np.asarray(jax.jit(pipe.encode_visual)(jnp.asarray(video)))  # one program, not per op
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def _diffusers_video(torch_pipe, latents, guidance, chi, frames):
    with torch.no_grad():
        return torch_pipe(PROMPTS, height=32, width=32, frames=frames, num_inference_steps=2,
                          guidance_scale=guidance, latents=torch.from_numpy(latents),
                          max_sequence_length=MAX_LEN, output_type="np",
                          use_resolution_binning=False,
                          complex_human_instruction=list(VIDEO_INSTRUCTION) if chi else None
                          ).frames


@pytest.mark.parametrize("guidance", [1.0, 6.0], ids=["cfg_off", "cfg_on"])
def test_whole_pipeline_matches_diffusers(torch_pipe, pipe, guidance):
    """generate from given latents at 5 frames (not the pipeline's 81), the instruction on;
    the negative prompt without it, as diffusers (family.tokenize_negative)."""
    frames = 5
    latents = np.random.default_rng(1).standard_normal(
        pipe.latent_shape(2, 32, 32, frames=frames)).astype(np.float32)
    assert latents.shape == (2, 4, 2, 4, 4)
    chi = True
    got = generate(pipe, PROMPTS, steps=2, guidance=guidance, height=32, width=32,
                   latents=latents, max_sequence_length=MAX_LEN, frames=frames)
    want = _diffusers_video(torch_pipe, latents, guidance, chi, frames)
    assert got.shape == want.shape == (2, frames, 32, 32, 3)
    np.testing.assert_allclose(got, want, rtol=0, atol=PIPELINE_ATOL)
    if guidance > 1:
        assert np.abs(_diffusers_video(torch_pipe, latents, 1.0, chi, frames) - want
                      ).max() > 1e-3


def test_bad_input_one_line_each(pipe):
    with pytest.raises(ValueError, match=r"multiples of 32; got 48x32$"):
        pipe.latent_shape(1, 48, 32, frames=9)
    with pytest.raises(ValueError, match="takes 4k\\+1 frames .* got 8$"):
        pipe.latent_shape(1, 32, 32, frames=8)
    with pytest.raises(ValueError, match="takes 4k\\+1 frames .* got None$"):
        pipe.latent_shape(1, 32, 32)
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        pipe.latent_shape(1, 32 * 33, 32, frames=9)
    assert pipe.latent_shape(3, 32, 64, frames=17) == (3, 4, 5, 4, 8)
    with pytest.raises(ValueError, match="video"):
        pipe.posterior_with(pipe.vae, jnp.zeros((1, 32, 32, 3)))
    # the video instruction plus the prompt overflow the tiny Gemma2's 1024 positions: one line
    with pytest.raises(ValueError, match=r"^the instruction plus a 1000-token prompt is \d+ tokens, "
                                         r"more than the text encoder's max_position_embeddings "
                                         r"1024; shorten max_sequence_length or the instruction"):
        pipe.tokenize(["a cat"], 1000)
    assert pipe.tokenize(["a cat"], 1000, instruction=())["input_ids"].shape == (1, 1000)


# ---------------------------------------------------------------------------- export

def _inputs():
    rng = np.random.default_rng(3)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    return (rng.standard_normal((2, 4, 3, 4, 4), np.float32), np.array([900, 130], np.int64),
            rng.standard_normal((2, 5, 16), np.float32), mask)


def _jax_out(model, x, t, text, mask):
    graph, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, *a: nnx.merge(graph, s)(
        a[0], a[1], a[2], encoder_attention_mask=a[3]))(state, *map(jnp.asarray, (x, text, t,
                                                                                  mask))))


def _torch_out(transformer, x, t, text, mask):
    with torch.no_grad():
        return transformer(torch.from_numpy(x), encoder_hidden_states=torch.from_numpy(text),
                           timestep=torch.from_numpy(t),
                           encoder_attention_mask=torch.from_numpy(mask)).sample.numpy()


def test_full_export_is_a_sana_video_pipeline_diffusers_loads(video_dir, torch_pipe, tmp_path):
    from diffusers import SanaVideoPipeline as TorchSanaVideo

    model, config = load_model(video_dir, component="transformer")
    rng = np.random.default_rng(0)
    for _, var in nnx.state(model, nnx.Param).flat_state():
        # numpy float32 add: the same sums without an eager XLA add per parameter shape
        var[...] = jnp.asarray(np.asarray(var[...]) + (0.05 * rng.standard_normal(var.shape)
                                                        ).astype(np.float32))
    dst = str(tmp_path / "step_2")
    export_full_pipeline(model, config, video_dir, dst,
                         rewritten=SanaVideoPipeline.export_components())
    exported = TorchSanaVideo.from_pretrained(dst)
    args = _inputs()
    want = _torch_out(exported.transformer, *args)
    assert np.abs(_torch_out(torch_pipe.transformer, *args) - want).max() > 1e-2
    np.testing.assert_allclose(_jax_out(model, *args), want, rtol=0, atol=PIPELINE_ATOL)


def test_lora_export_loads_with_sana_video_load_lora_weights(video_dir, tmp_path):
    from diffusers import SanaVideoPipeline as TorchSanaVideo

    model, _ = load_model(video_dir, component="transformer")
    paths = lora_lib.attach_lora(model, LORA_TARGETS, r=4, lora_alpha=4)
    rng = np.random.default_rng(1)
    for _, var in nnx.state(model, nnx.LoRAParam).flat_state():
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var.shape), jnp.float32)
    _, params, _ = nnx.split(model, nnx.LoRAParam, ...)
    dst = tmp_path / "step_1"
    export_lora(params, lora_lib.adapter_config(4, 4, LORA_TARGETS), str(dst),
                prefix=SanaVideoPipeline.lora_prefix)
    assert json.loads((dst / "lora" / "adapter_config.json").read_text())["lora_alpha"] == 4
    torch_pipe = TorchSanaVideo.from_pretrained(video_dir)
    args = _inputs()
    base = _torch_out(torch_pipe.transformer, *args)
    torch_pipe.load_lora_weights(str(dst / "lora"), weight_name=LORA_WEIGHT_NAME)
    peft_layers = {name for name, module in torch_pipe.transformer.named_modules()
                   if len(getattr(module, "lora_A", ()))}
    assert peft_layers == set(paths) and len(paths) == 16
    want = _torch_out(torch_pipe.transformer, *args)
    assert np.abs(want - base).max() > 1e-2
    np.testing.assert_allclose(_jax_out(model, *args), want, rtol=0, atol=PIPELINE_ATOL)
