"""Gemma2Model (SANA's text encoder): parity with transformers torch on identical weights with a
padded batch, SANA's token selection, converter round trips and key errors."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from converters import gemma2 as gemma2_conv
from converters.registry import spec_for
from converters.safetensors_io import open_checkpoint, save_checkpoint
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.mesh import MESH_AXES
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes
from wfm_jax.models.text.gemma2 import Gemma2Config, select_sana_tokens

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

ATOL = 2e-5
SEQ = 12

CONFIGS = {
    # spec §4.3's tiny SANA text encoder (released defaults: window 4096, caps 50, scalar 256)
    "spec": dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                 max_position_embeddings=512),
    # every Gemma2 peculiarity biting at SEQ tokens: a 4-token window, sliding/full/sliding
    # layers, scores soft-capped at 2, a query scalar unlike head_dim, 4 query heads on 2 kv heads
    "window": dict(vocab_size=40, hidden_size=24, intermediate_size=40, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=2.0,
                   query_pre_attn_scalar=5, rope_theta=100.0),
}


def _torch_model(cfg: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.Gemma2Model(transformers.Gemma2Config(**cfg)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # norms are stored as zeros (scale 1 + w) and the 0.02 init keeps attention near
        # uniform: draw everything larger so a swapped mapping or a lost cap shows
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def _numpy_state(model) -> dict[str, np.ndarray]:
    out = {}
    for k, t in model.state_dict().items():
        t = t.detach().contiguous()
        out[k] = (t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
                  if t.dtype == torch.bfloat16 else t.numpy())
    return out


def _loaders(state):
    return {k: (lambda v=v: v) for k, v in state.items()}


def _jax_model(cfg: dict, state, dtype=None, param_dtype=jnp.float32):
    config = transformers.Gemma2Config(**cfg).to_dict()
    model = abstract_module(lambda: gemma2_conv.make_model(config, dtype=dtype,
                                                          param_dtype=param_dtype,
                                                          rngs=nnx.Rngs(0)))
    flat = convert_to_jax(gemma2_conv.build_table(config), _loaders(state), flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key]))
    return model


def _apply(model, ids, mask):
    graph, state = nnx.split(model)
    return jax.jit(lambda s, i, m: nnx.merge(graph, s)(i, m))(state, ids, mask)


def _tokens(batch: int, seed: int):
    """BOS first, right padding (SANA's tokenizer side) of random length; row 0 unpadded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 40, size=(batch, SEQ))
    ids[:, 0] = 2
    mask = np.ones((batch, SEQ), np.int64)
    for row, length in enumerate(rng.integers(2, SEQ, size=batch)):
        if row:
            ids[row, length:] = 0
            mask[row, length:] = 0
    return ids, mask


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    cfg = CONFIGS[request.param]
    torch_model = _torch_model(cfg)
    return cfg, torch_model, _jax_model(cfg, _numpy_state(torch_model))


@pytest.mark.parametrize("padded", [True, False])
def test_parity_with_transformers(pair, padded):
    cfg, torch_model, jax_model = pair
    ids, mask = _tokens(3, 1)
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids),
                           attention_mask=torch.from_numpy(mask) if padded else None)
    want = want.last_hidden_state.numpy()
    got = np.asarray(_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask) if padded else None))
    assert got.shape == (3, SEQ, cfg["hidden_size"]) and got.dtype == np.float32
    assert want.std() > 0.1
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_fully_masked_rows_match_transformers(pair):
    """Left padding and an all-padding row leave query rows with no visible key: transformers
    adds the dtype's minimum, which makes those rows uniform; so must we."""
    cfg, torch_model, jax_model = pair
    ids, mask = _tokens(3, 1)
    mask[1] = 0
    mask[1, 4:9] = 1
    mask[2] = 0
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    got = np.asarray(_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask)))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want.last_hidden_state.numpy(), rtol=0, atol=ATOL)


def test_padding_mask_bites(pair):
    """The padded parity above means something only if the mask changes the output: it must
    change the padded positions (they stop reading padding keys) and leave real tokens alone."""
    cfg, _, jax_model = pair
    ids, mask = _tokens(3, 1)
    masked = np.asarray(_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask)))
    unmasked = np.asarray(_apply(jax_model, jnp.asarray(ids), None))
    pad = mask == 0
    assert pad.any() and np.abs(masked - unmasked)[pad].max() > 1e-3
    # causal: the real tokens never see later padding, so they agree with and without the mask
    np.testing.assert_allclose(masked[~pad], unmasked[~pad], rtol=0, atol=1e-6)


def test_bf16_compute_tracks_fp32(pair):
    cfg, torch_model, jax_model = pair
    ids, mask = _tokens(2, 4)
    ref = np.asarray(_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask)))
    bf16 = _jax_model(cfg, _numpy_state(torch_model), dtype=jnp.bfloat16)
    got = _apply(bf16, jnp.asarray(ids), jnp.asarray(mask))
    assert got.dtype == jnp.bfloat16
    err = np.max(np.abs(np.asarray(got, np.float32) - ref))
    assert 0 < err < 0.05 * np.max(np.abs(ref)), err


def test_sharded_matches_torch():
    cfg = CONFIGS["window"]
    torch_model = _torch_model(cfg)
    jax_model = _jax_model(cfg, _numpy_state(torch_model))
    ids, mask = _tokens(4, 5)
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    mesh = jax.make_mesh((2, 2, 2), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        got = _apply(jax_model, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), want.last_hidden_state.numpy(), atol=ATOL, rtol=0)


def test_select_sana_tokens_matches_pipeline_indexing():
    # SanaPipeline.encode_prompt: select_index = [0] + list(range(-max_length + 1, 0))
    hidden = torch.randn(2, 9, 4)
    mask = torch.randint(0, 2, (2, 9))
    index = [0] + list(range(-5 + 1, 0))
    got_h, got_m = select_sana_tokens(jnp.asarray(hidden.numpy()), jnp.asarray(mask.numpy()), 5)
    np.testing.assert_array_equal(np.asarray(got_h), hidden[:, index].numpy())
    np.testing.assert_array_equal(np.asarray(got_m), mask[:, index].numpy())
    with pytest.raises(ValueError, match="selects 10 tokens"):
        select_sana_tokens(jnp.asarray(hidden.numpy()), jnp.asarray(mask.numpy()), 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_round_trip_bit_identical(dtype, tmp_path):
    """torch save_pretrained -> safetensors -> jax -> safetensors -> torch load strict."""
    torch_model = _torch_model(CONFIGS["window"]).to(dtype)
    src = tmp_path / "src"
    torch_model.save_pretrained(src)
    with open(src / "config.json") as f:
        config = json.load(f)
    spec = spec_for(config)
    assert spec is gemma2_conv.SPEC
    param_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    jax_model = abstract_module(lambda: spec.make_model(config, param_dtype=param_dtype,
                                                       rngs=nnx.Rngs(1)))
    table = spec.build_table(config)
    flat = convert_to_jax(table, open_checkpoint(str(src)), flat_shapes(jax_model))
    for key, var in flat_params(jax_model).items():
        var.set_value(jnp.asarray(flat[key]))
    assert all(v.dtype == param_dtype for v in flat_params(jax_model).values())
    out = tmp_path / "out"
    save_checkpoint(convert_to_diffusers(table, flat_arrays(jax_model)), str(out),
                    stem=spec.weights_stem)
    assert os.listdir(out) == ["model.safetensors"]
    back = {k: v() for k, v in open_checkpoint(str(out)).items()}
    original = _numpy_state(torch_model)
    assert set(back) == set(original)
    for key, value in original.items():
        assert back[key].dtype == value.dtype, key
        np.testing.assert_array_equal(back[key].view(np.uint8), value.view(np.uint8), err_msg=key)
    reloaded = transformers.Gemma2Model(transformers.Gemma2Config(**CONFIGS["window"])).to(dtype)
    reloaded.load_state_dict({k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
                              if v.dtype == ml_dtypes.bfloat16 else torch.from_numpy(v)
                              for k, v in back.items()}, strict=True)
    for key, value in torch_model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_missing_extra_and_misshaped_keys_are_named():
    cfg = CONFIGS["spec"]
    config = transformers.Gemma2Config(**cfg).to_dict()
    state = _numpy_state(_torch_model(cfg))
    table = gemma2_conv.build_table(config)
    shapes = flat_shapes(abstract_module(lambda: gemma2_conv.make_model(config,
                                                                       rngs=nnx.Rngs(0))))
    assert {r.jax for r in table} == set(shapes) and {r.hf for r in table} == set(state)
    victim = "layers.1.pre_feedforward_layernorm.weight"
    with pytest.raises(ConversionError, match=f"missing keys: .*{victim}"):
        convert_to_jax(table, _loaders({k: v for k, v in state.items() if k != victim}), shapes)
    with pytest.raises(ConversionError, match=r"unexpected keys: .*lm_head\.weight"):
        convert_to_jax(table, _loaders({**state, "lm_head.weight": state["embed_tokens.weight"]}),
                       shapes)
    bad = dict(state, **{"layers.0.self_attn.k_proj.weight": np.zeros((16, 16), np.float32)})
    with pytest.raises(ConversionError, match=r"wrong shape for layers\.0\.self_attn\.k_proj"):
        convert_to_jax(table, _loaders(bad), shapes)


def test_config_errors_are_one_line():
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        Gemma2Config.from_dict({"rope_parameters": {"rope_type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match="layer_types"):
        Gemma2Config.from_dict({"num_hidden_layers": 2, "layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="key/value heads"):
        Gemma2Config.from_dict({"num_attention_heads": 3, "num_key_value_heads": 2})
    # transformers 4's top-level rope_theta and 5's rope_parameters both reach the model
    assert Gemma2Config.from_dict({"rope_theta": 500.0}).rope_theta == 500.0
    assert Gemma2Config.from_dict(
        {"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}}).rope_theta == 7.0


def _toy_gemma_tokenizer():
    """spec §4.3's toy tokenizer: specials, byte fallback, single characters, no merges."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"<0x{i:02X}>": 4 + i for i in range(256)})
    for ch in "abcdefghijklmnopqrstuvwxyz▁.,:\n":
        vocab.setdefault(ch, len(vocab))
    tok = transformers.GemmaTokenizer(vocab=vocab, merges=[])
    tok.padding_side = "right"
    return tok


@pytest.mark.parametrize("chi", [None, ["give the image details:", "be exact"]],
                         ids=["plain", "chi"])
def test_sana_prompt_embeds_match_pipeline_encode_prompt(chi):
    """SanaPipeline.encode_prompt (tokenise, optional CHI prefix, Gemma2, select tokens) vs the
    same tokenisation fed to our Gemma2Model and select_sana_tokens."""
    from diffusers import SanaPipeline
    tok = _toy_gemma_tokenizer()
    cfg = dict(CONFIGS["spec"], vocab_size=len(tok))
    torch_model = _torch_model(cfg)
    pipe = SanaPipeline(tokenizer=tok, text_encoder=torch_model, vae=None, transformer=None,
                        scheduler=None)
    prompts, max_len = ["a cat", "a dog sits on a mat by the door"], 8
    with torch.no_grad():
        want, want_mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False,
                                                   device="cpu", max_sequence_length=max_len,
                                                   complex_human_instruction=chi)
    # the pipeline's tokenisation (_get_gemma_prompt_embeds; prompts are already lower-case)
    total = max_len
    if chi:
        prefix = "\n".join(chi)
        prompts = [prefix + p for p in prompts]
        total = len(tok.encode(prefix)) + max_len - 2
    tokens = tok(prompts, padding="max_length", max_length=total, truncation=True,
                 add_special_tokens=True, return_tensors="np")
    ids, mask = jnp.asarray(tokens.input_ids), jnp.asarray(tokens.attention_mask)
    got, got_mask = select_sana_tokens(
        _apply(_jax_model(cfg, _numpy_state(torch_model)), ids, mask), mask, max_len)
    assert want_mask.numpy().min() == 0  # the short prompt is padded: the mask matters
    np.testing.assert_array_equal(np.asarray(got_mask), want_mask.numpy())
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=0, atol=ATOL)
