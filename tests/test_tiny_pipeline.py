"""The tiny SD3 pipeline builder: diffusers loads and runs what it writes; offline and seeded."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from converters.registry import spec_for
from converters.safetensors_io import open_checkpoint
from converters.table import convert_to_jax
from wfm_jax import tiny
from wfm_jax.models.state import flat_params, flat_shapes

PROMPTS = ["a photo of the cat", "a red dog on the blue sofa"]
WEIGHTED = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny") / "pipe"), seed=0)


@pytest.fixture(scope="module")
def pipe(tiny_dir):
    from diffusers import StableDiffusion3Pipeline

    return StableDiffusion3Pipeline.from_pretrained(tiny_dir)


def test_diffusers_runs_two_steps(pipe):
    images = pipe(PROMPTS, num_inference_steps=2, height=32, width=32, guidance_scale=4.5,
                  generator=torch.Generator().manual_seed(0), output_type="np").images
    assert images.shape == (2, 32, 32, 3)
    assert np.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    for image in images:  # random weights must still give a picture, not a flat colour
        assert image.std() > 1e-2
    # the prompt reaches the pixels through all three encoders and the transformer
    assert np.abs(images[0] - images[1]).max() > 1e-2


def test_tokenizers_match_encoder_configs(pipe):
    for tok, enc in ((pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)):
        assert tok.model_max_length == enc.config.max_position_embeddings == tiny.CLIP_MAX_LENGTH
        assert (tok.bos_token_id, tok.eos_token_id) == (enc.config.bos_token_id,
                                                        enc.config.eos_token_id)
        assert len(tok) == enc.config.vocab_size
        ids = tok(PROMPTS[0], padding="max_length", max_length=77).input_ids
        n = ids.index(tok.eos_token_id)
        assert ids[0] == tok.bos_token_id and set(ids[n + 1:]) == {tok.pad_token_id}
        assert tok.decode(ids[1:n]) == PROMPTS[0]
    assert pipe.tokenizer_2.pad_token == "!"  # as SD3's CLIP-G: padding differs from EOS
    t5 = pipe.tokenizer_3(PROMPTS[1]).input_ids
    assert t5[-1] == pipe.tokenizer_3.eos_token_id and pipe.tokenizer_3.unk_token_id not in t5
    assert pipe.tokenizer_3.decode(t5, skip_special_tokens=True) == PROMPTS[1]
    assert pipe.text_encoder_3.config.vocab_size >= len(pipe.tokenizer_3)


def _saved_weights(tiny_dir: str, name: str) -> dict[str, np.ndarray]:
    return {k: v() for k, v in open_checkpoint(os.path.join(tiny_dir, name)).items()}


def test_weights_deterministic_in_seed_and_never_constant(tiny_dir):
    same, other = tiny.build_components(seed=0), tiny.build_components(seed=1)
    for name in WEIGHTED:
        saved = _saved_weights(tiny_dir, name)
        rebuilt = {k: v.numpy() for k, v in same[name].state_dict().items()}
        differs = False
        for key, value in saved.items():
            np.testing.assert_array_equal(value, rebuilt[key], err_msg=f"{name}/{key}")
            if value.size > 1:
                assert value.std() > 0, f"{name}/{key} is constant"
            differs |= not np.array_equal(value, other[name].state_dict()[key].numpy())
        assert differs, f"{name}: seed 1 gives the same weights as seed 0"


def test_jax_clip_g_and_t5_load_and_match_on_real_tokens(tiny_dir, pipe):
    """Registry + converters on the builder's files; CLIP-G pads with '!' so pooling must find
    the first EOS, not the largest id."""
    for name, tok, torch_enc in (("text_encoder_2", pipe.tokenizer_2, pipe.text_encoder_2),
                                 ("text_encoder_3", pipe.tokenizer_3, pipe.text_encoder_3)):
        with open(os.path.join(tiny_dir, name, "config.json")) as f:
            config = json.load(f)
        spec = spec_for(config)
        model = nnx.eval_shape(lambda: spec.make_model(config, rngs=nnx.Rngs(0)))
        flat = convert_to_jax(spec.build_table(config),
                              open_checkpoint(os.path.join(tiny_dir, name)), flat_shapes(model))
        for key, var in flat_params(model).items():
            var.set_value(jnp.asarray(flat[key]))
        ids = tok(PROMPTS, padding="max_length", max_length=77, truncation=True,
                  return_tensors="np").input_ids
        graph, state = nnx.split(model)
        got = jax.jit(lambda s, i: nnx.merge(graph, s)(i))(state, jnp.asarray(ids))
        with torch.no_grad():
            ref = torch_enc(torch.from_numpy(ids), output_hidden_states=True)
        if name == "text_encoder_3":
            np.testing.assert_allclose(np.asarray(got), ref.last_hidden_state.numpy(),
                                       atol=2e-5, rtol=0)
        else:
            np.testing.assert_allclose(np.asarray(got["penultimate"]),
                                       ref.hidden_states[-2].numpy(), atol=2e-5, rtol=0)
            np.testing.assert_allclose(np.asarray(got["text_embeds"]), ref.text_embeds.numpy(),
                                       atol=2e-5, rtol=0)


def test_cli_writes_and_refuses_to_clobber(tmp_path, capsys):
    target = tmp_path / "cli_pipe"
    assert tiny.main([str(target), "--seed", "3"]) == 0
    with open(target / "model_index.json") as f:
        assert json.load(f)["_class_name"] == "StableDiffusion3Pipeline"
    before = sorted(os.listdir(target))
    capsys.readouterr()
    assert tiny.main([str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not empty" in err and str(target) in err
    assert sorted(os.listdir(target)) == before
    assert sorted(os.listdir(tmp_path)) == ["cli_pipe"]  # no temporary directory left behind
