"""SanaPipeline as a model family: the tiny pipeline (wfm_jax.families.sana.tiny, spec §4.3 sizes) loaded
by diffusers and by `load_pipeline` must agree in fp32: prompt encoding with and without the
complex human instruction (2e-5), the DC-AE latents (2e-5), and the whole pipeline from given
latents with CFG off and on (1e-4), run through the generic `generate`. Exports: a full
fine-tune is a SanaPipeline dir diffusers loads, a LoRA loads with `load_lora_weights`; both
reproduce the JAX transformer (1e-4)."""
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
from wfm_jax.families.base import PipelineError, families, load_pipeline
from wfm_jax.families.sana.pipeline import IMAGE_INSTRUCTION, MASK_KEY, TEXT_KEY, SanaPipeline
from wfm_jax.models import lora as lora_lib
from wfm_jax.programs.sample import generate
from wfm_jax.train.export import LORA_WEIGHT_NAME, export_full_pipeline, export_lora

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

ATOL, PIPELINE_ATOL = 2e-5, 1e-4
MAX_LEN = 12
PROMPTS = ["A cat sleeping", "  a busy city street with red flowers and a bus by the sea  "]
SANA_LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                     "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0")  # spec §5.3


@pytest.fixture(scope="module")
def sana_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("sana") / "pipe"), family="sana")


@pytest.fixture(scope="module")
def torch_pipe(sana_dir):
    from diffusers import SanaPipeline as TorchSana
    return TorchSana.from_pretrained(sana_dir)


@pytest.fixture(scope="module")
def pipe(sana_dir):
    return load_pipeline(sana_dir)


@pytest.fixture(scope="module")
def encode_text(pipe):
    """encode_text_with under one jit the tests share (one compile per token layout; eager,
    every Gemma2 op compiles on its own)."""
    return jax.jit(lambda ids: pipe.encode_text_with(pipe.text_encoders, ids, MAX_LEN))


def test_load_pipeline_dispatch(sana_dir, pipe):
    assert type(pipe) is SanaPipeline and pipe.family == "sana" and not pipe.is_video
    assert families()["sana"] == "SanaPipeline"
    assert families()["sana_video"] == "SanaVideoPipeline"
    assert pipe.instruction == IMAGE_INSTRUCTION  # on by default, as diffusers' __call__
    assert (pipe.default_solver, pipe.default_steps, pipe.default_guidance,
            pipe.default_max_sequence_length) == ("dpm_solver", 20, 4.5, 300)
    with pytest.raises(PipelineError, match="SanaPipeline .*'sana' family.* recipe is for the "
                                            "'wan' family"):
        load_pipeline(sana_dir, family="wan")
    assert load_pipeline(sana_dir, instruction=()).instruction == ()


@pytest.mark.parametrize("chi", [True, False], ids=["instruction", "plain"])
def test_prompt_encoding_matches_encode_prompt(torch_pipe, pipe, encode_text, chi):
    """The conditioning dict (states and mask) equals diffusers' encode_prompt, positive and
    negative (diffusers encodes the negative prompt without the instruction)."""
    with torch.no_grad():
        want, want_mask, neg, neg_mask = torch_pipe.encode_prompt(
            PROMPTS, do_classifier_free_guidance=True, negative_prompt="", device="cpu",
            max_sequence_length=MAX_LEN,
            complex_human_instruction=list(IMAGE_INSTRUCTION) if chi else None)
    got = encode_text(pipe.tokenize(PROMPTS, MAX_LEN, instruction=None if chi else ()))
    assert set(got) == {TEXT_KEY, MASK_KEY}
    assert want_mask.numpy().min() == 0 and want_mask.numpy()[1].min() == 1  # one padded row
    np.testing.assert_array_equal(np.asarray(got[MASK_KEY]), want_mask.numpy())
    np.testing.assert_allclose(np.asarray(got[TEXT_KEY]), want.numpy(), rtol=0, atol=ATOL)
    got = encode_text(pipe.tokenize(["", ""], MAX_LEN, instruction=()))
    np.testing.assert_array_equal(np.asarray(got[MASK_KEY]), neg_mask.numpy())
    np.testing.assert_allclose(np.asarray(got[TEXT_KEY]), neg.numpy(), rtol=0, atol=ATOL)


def test_latents_and_decode_match_diffusers(torch_pipe, pipe):
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        z = torch_pipe.vae.encode(torch.from_numpy(pixels).permute(0, 3, 1, 2)).latent
        want = z.numpy() * torch_pipe.vae.config.scaling_factor
    got = np.asarray(jax.jit(pipe.encode_visual)(jnp.asarray(pixels)))  # one program, not per op
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    with torch.no_grad():
        image = torch_pipe.vae.decode(torch.from_numpy(want) / torch_pipe.vae.config.scaling_factor
                                      ).sample
        want_px = torch_pipe.image_processor.postprocess(image, output_type="np")
    np.testing.assert_allclose(np.asarray(jax.jit(pipe.decode)(jnp.asarray(want))), want_px, rtol=0,
                               atol=PIPELINE_ATOL)


def _diffusers_images(torch_pipe, latents, guidance, chi):
    with torch.no_grad():
        return torch_pipe(PROMPTS, height=32, width=32, num_inference_steps=3,
                          guidance_scale=guidance, latents=torch.from_numpy(latents),
                          max_sequence_length=MAX_LEN, output_type="np",
                          use_resolution_binning=False,
                          complex_human_instruction=list(IMAGE_INSTRUCTION) if chi else None
                          ).images


@pytest.mark.parametrize("guidance,chi", [(1.0, True), (4.5, False), (4.5, True)],
                         ids=["cfg_off", "cfg_on", "cfg_on_instruction"])
def test_whole_pipeline_matches_diffusers(torch_pipe, pipe, guidance, chi):
    """generate (DPM-Solver++ from the family's schedule, text mask on cross-attention) from
    given latents. The negative prompt is encoded without the instruction, as diffusers does
    (family.tokenize_negative), so CFG with the instruction on matches too."""
    latents = np.random.default_rng(1).standard_normal(pipe.latent_shape(2, 32, 32),
                                                       ).astype(np.float32)
    pipe.instruction = IMAGE_INSTRUCTION if chi else ()
    try:
        got = generate(pipe, PROMPTS, steps=3, guidance=guidance, height=32, width=32,
                       latents=latents, max_sequence_length=MAX_LEN)
    finally:
        pipe.instruction = IMAGE_INSTRUCTION
    want = _diffusers_images(torch_pipe, latents, guidance, chi)
    assert got.shape == want.shape == (2, 32, 32, 3)
    np.testing.assert_allclose(got, want, rtol=0, atol=PIPELINE_ATOL)
    if guidance > 1:  # guidance and the negative branch matter
        assert np.abs(_diffusers_images(torch_pipe, latents, 1.0, chi) - want).max() > 1e-3


@pytest.mark.slow  # two compilations of the whole pipeline: ~20 s on 2 cores
def test_sharded_load_generates_the_same(sana_dir, pipe):
    """Loaded onto a (data 2, fsdp 4) mesh of the 8 CPU devices, generate (CFG on) gives the
    single-device pixels."""
    from wfm_jax.core import mesh as wmesh
    sharded = load_pipeline(sana_dir, mesh=wmesh.make_mesh(data=2, fsdp=4),
                            rules=wmesh.active_rules())
    kernel = sharded.transformer.caption_projection.linear_1.kernel[...]
    assert "fsdp" in str(kernel.sharding.spec)
    latents = np.random.default_rng(4).standard_normal((2, 4, 16, 16)).astype(np.float32)
    run = [generate(p, PROMPTS, steps=2, guidance=4.5, height=32, width=32, latents=latents,
                    max_sequence_length=MAX_LEN) for p in (pipe, sharded)]
    np.testing.assert_allclose(run[1], run[0], rtol=0, atol=ATOL)


def test_text_mask_reaches_cross_attention(pipe, encode_text):
    """velocity_with passes the mask: with the padding unmasked the output changes."""
    cond = encode_text(pipe.tokenize(PROMPTS, MAX_LEN))  # = pipe.encode_prompt, jitted
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 16, 16)), jnp.float32)
    t = jnp.asarray([900.0, 300.0])
    velocity = jax.jit(pipe.velocity)  # one compile for both masks
    masked = velocity(x, t, cond)
    unmasked = velocity(x, t, {**cond, MASK_KEY: jnp.ones_like(cond[MASK_KEY])})
    assert float(jnp.abs(masked[0] - unmasked[0]).max()) > 1e-4  # row 0 has padding
    np.testing.assert_allclose(np.asarray(masked[1]), np.asarray(unmasked[1]), atol=1e-6)


def test_bad_input_one_line_each(pipe):
    for h, w in ((48, 32), (32, 16)):
        with pytest.raises(ValueError, match=r"multiples of 32; got \d+x\d+$"):
            pipe.latent_shape(1, h, w)
    # the instruction (~240 tokens here) plus 900 prompt tokens pass Gemma2's 1024 positions
    with pytest.raises(ValueError, match="more than the text encoder's max_position_embeddings "
                                         "1024"):
        pipe.tokenize(["a cat"], 900)
    assert pipe.tokenize(["a cat"], 900, instruction=())["input_ids"].shape == (1, 900)
    with pytest.raises(ValueError, match="^a 1100-token prompt is 1100 tokens, more than .*"
                                         "1024; shorten max_sequence_length$"):
        pipe.tokenize(["a cat"], 1100, instruction=())
    with pytest.raises(ValueError, match="bare array"):
        pipe.cond_from_embedding(np.zeros((1, 4, 16), np.float32))
    with pytest.raises(ValueError, match="needs 'encoder_attention_mask'"):
        pipe.cond_from_embedding({"prompt_embeds": np.zeros((1, 4, 16), np.float32)})
    cond = pipe.cond_from_embedding({"prompt_embeds": np.zeros((1, 4, 16)),
                                     "prompt_attention_mask": np.ones((1, 4))})
    assert cond[TEXT_KEY].shape == (1, 4, 16) and cond[MASK_KEY].dtype == np.float32


def test_refuses_sana_sprint_and_other_pipelines(sana_dir, tmp_path):
    import shutil
    sprint = tmp_path / "sprint"
    shutil.copytree(sana_dir, sprint)
    cfg_path = sprint / "transformer" / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "guidance_embeds": True}))
    with pytest.raises(PipelineError, match="guidance_embeds=True .* not supported"):
        load_pipeline(str(sprint))
    from wfm_jax.families.sana.video_pipeline import SanaVideoPipeline
    with pytest.raises(PipelineError, match="holds a 'SanaPipeline', not a SanaVideoPipeline"):
        SanaVideoPipeline.load(sana_dir)


# ---------------------------------------------------------------------------- export

def _inputs():
    rng = np.random.default_rng(3)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    return (rng.standard_normal((2, 4, 8, 8), np.float32), np.array([900, 130], np.int64),
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


def test_full_export_is_a_sana_pipeline_diffusers_loads(sana_dir, torch_pipe, tmp_path):
    from diffusers import SanaPipeline as TorchSana

    model, config = load_model(sana_dir, component="transformer")
    rng = np.random.default_rng(0)
    for _, var in nnx.state(model, nnx.Param).flat_state():  # stand-in for a fine-tune
        # numpy float32 add: the same sums without an eager XLA add per parameter shape
        var[...] = jnp.asarray(np.asarray(var[...]) + (0.05 * rng.standard_normal(var.shape)
                                                        ).astype(np.float32))
    dst = str(tmp_path / "step_2")
    assert export_full_pipeline(model, config, sana_dir, dst,
                                rewritten=SanaPipeline.export_components()) == dst
    exported = TorchSana.from_pretrained(dst)
    args = _inputs()
    want = _torch_out(exported.transformer, *args)
    assert np.abs(_torch_out(torch_pipe.transformer, *args) - want).max() > 1e-2
    np.testing.assert_allclose(_jax_out(model, *args), want, rtol=0, atol=PIPELINE_ATOL)
    reloaded = load_pipeline(dst)  # the fp32 round trip through the export is bit-exact
    assert type(reloaded) is SanaPipeline
    ours = dict(nnx.state(model, nnx.Param).flat_state())
    for path, var in nnx.state(reloaded.transformer, nnx.Param).flat_state():
        np.testing.assert_array_equal(np.asarray(var[...]), np.asarray(ours[path][...]))


def test_lora_export_loads_with_sana_load_lora_weights(sana_dir, tmp_path):
    from diffusers import SanaPipeline as TorchSana

    model, _ = load_model(sana_dir, component="transformer")
    paths = lora_lib.attach_lora(model, SANA_LORA_TARGETS, r=4, lora_alpha=4)
    assert len(paths) == 2 * 8  # two blocks, attn1 + attn2, q/k/v/out each
    rng = np.random.default_rng(1)
    for _, var in nnx.state(model, nnx.LoRAParam).flat_state():  # B = 0 would export nothing
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var.shape), jnp.float32)
    _, params, _ = nnx.split(model, nnx.LoRAParam, ...)
    dst = tmp_path / "step_1"
    export_lora(params, lora_lib.adapter_config(4, 4, SANA_LORA_TARGETS), str(dst),
                prefix=SanaPipeline.lora_prefix)
    assert json.loads((dst / "lora" / "adapter_config.json").read_text())["r"] == 4
    torch_pipe = TorchSana.from_pretrained(sana_dir)
    args = _inputs()
    base = _torch_out(torch_pipe.transformer, *args)
    torch_pipe.load_lora_weights(str(dst / "lora"), weight_name=LORA_WEIGHT_NAME)
    peft_layers = {name for name, module in torch_pipe.transformer.named_modules()
                   if len(getattr(module, "lora_A", ()))}
    assert peft_layers == set(paths)
    want = _torch_out(torch_pipe.transformer, *args)
    assert np.abs(want - base).max() > 1e-2
    np.testing.assert_allclose(_jax_out(model, *args), want, rtol=0, atol=PIPELINE_ATOL)
