"""CLIP and T5 text encoders: parity with transformers torch, converter round trips, key errors."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from converters import clip as clip_conv
from converters import t5 as t5_conv
from converters.registry import spec_for
from converters.safetensors_io import open_checkpoint, save_checkpoint
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.mesh import MESH_AXES
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes
from wfm_jax.models.text.t5 import relative_position_buckets

ATOL = 2e-5
SEQ = 12

CLIP_CONFIGS = {
    # eos_token_id 49 (not the largest id): pooling at the first EOS, the current rule
    "quick_gelu": dict(vocab_size=99, hidden_size=16, projection_dim=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=37, max_position_embeddings=20,
                       hidden_act="quick_gelu", eos_token_id=49, bos_token_id=48, pad_token_id=49),
    # eos_token_id 2: the legacy rule, pooling at the largest token id
    "gelu_legacy_eos": dict(vocab_size=99, hidden_size=24, projection_dim=32, num_hidden_layers=2,
                            num_attention_heads=3, intermediate_size=40, max_position_embeddings=16,
                            hidden_act="gelu", layer_norm_eps=1e-6, eos_token_id=2,
                            bos_token_id=1, pad_token_id=0),
}
T5_CONFIG = dict(vocab_size=64, d_model=32, d_kv=8, num_heads=2, num_layers=2, d_ff=37,
                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                 feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)


def _randomise_constants(model: torch.nn.Module, seed: int) -> None:
    """Norm weights start at 1 and biases at 0; perturb them so a swapped mapping shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and float(p.std()) == 0.0:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def _torch_model(cls, config, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    _randomise_constants(model, seed + 1)
    return model


def _loaders(state: dict[str, np.ndarray]):
    return {k: (lambda v=v: v) for k, v in state.items()}


def _numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    out = {}
    for k, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        out[k] = (t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
                  if t.dtype == torch.bfloat16 else t.numpy())
    return out


def _set_params(model, flat: dict[str, np.ndarray]) -> None:
    """Fill an abstract (nnx.eval_shape) model; avoids slow eager random init on CPU."""
    params = flat_params(model)
    assert set(params) == set(flat)
    for key, var in params.items():
        var.set_value(jnp.asarray(flat[key]))


def _jax_model(make_model, config: dict, table, hf_state, param_dtype=jnp.float32, dtype=None):
    model = abstract_module(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0)))
    _set_params(model, convert_to_jax(table, _loaders(hf_state), flat_shapes(model)))
    return model


def _jit_apply(model, *args, **kwargs):
    graph, state = nnx.split(model)
    fn = jax.jit(lambda state, *a: nnx.merge(graph, state)(*a, **kwargs))
    return fn(state, *args)


def _clip_tokens(cfg: dict, batch: int, rng: np.random.Generator):
    """Random ids, an EOS per row at a random place, pad (mask 0) after it."""
    eos, pad = cfg["eos_token_id"], cfg["pad_token_id"]
    ids = rng.integers(3, cfg["vocab_size"] - 3, size=(batch, SEQ))
    mask = np.ones((batch, SEQ), np.int64)
    for row, end in enumerate(rng.integers(2, SEQ, size=batch)):
        ids[row, end] = eos
        ids[row, end + 1:] = pad
        mask[row, end + 1:] = 0
    mask[0] = 1  # one row without padding
    return ids, mask


# ---- CLIP -------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(CLIP_CONFIGS))
def clip_pair(request):
    cfg = CLIP_CONFIGS[request.param]
    torch_model = _torch_model(transformers.CLIPTextModelWithProjection,
                               transformers.CLIPTextConfig(**cfg))
    table = clip_conv.build_table(cfg)
    jax_model = _jax_model(clip_conv.make_model, cfg, table, _numpy_state(torch_model))
    return cfg, torch_model, jax_model


@pytest.mark.parametrize("padded", [False, True])
def test_clip_parity(clip_pair, padded):
    cfg, torch_model, jax_model = clip_pair
    ids, mask = _clip_tokens(cfg, 3, np.random.default_rng(1))
    with torch.no_grad():
        ref = torch_model(torch.from_numpy(ids),
                          attention_mask=torch.from_numpy(mask) if padded else None,
                          output_hidden_states=True)
    out = _jit_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask) if padded else None,
                     output_hidden_states=True)
    assert len(ref.hidden_states) == cfg["num_hidden_layers"] + 1
    expected = dict(last_hidden_state=ref.last_hidden_state, penultimate=ref.hidden_states[-2],
                    text_embeds=ref.text_embeds)
    # every hidden state too (clip_skip reads hidden_states[-(skip + 2)])
    expected.update({f"hidden_states[{i}]": h for i, h in enumerate(ref.hidden_states)})
    got_all = dict(out, **{f"hidden_states[{i}]": h for i, h in enumerate(out["hidden_states"])})
    assert len(out["hidden_states"]) == len(ref.hidden_states)
    for name, want in expected.items():
        got = np.asarray(got_all[name])
        assert got.shape == tuple(want.shape), name
        np.testing.assert_allclose(got, want.numpy(), atol=ATOL, rtol=0, err_msg=name)


# ---- T5 ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def t5_pair():
    torch_model = _torch_model(transformers.T5EncoderModel, transformers.T5Config(**T5_CONFIG))
    table = t5_conv.build_table(T5_CONFIG)
    jax_model = _jax_model(t5_conv.make_model, T5_CONFIG, table, _t5_saved_state(torch_model))
    return torch_model, jax_model


def _t5_saved_state(torch_model) -> dict[str, np.ndarray]:
    """The keys save_pretrained writes: the tied embedding copy is not stored."""
    state = _numpy_state(torch_model)
    del state[t5_conv.TIED_COPY]
    return state


def _t5_tokens(batch: int, rng: np.random.Generator):
    ids = rng.integers(2, T5_CONFIG["vocab_size"], size=(batch, SEQ))
    mask = np.ones((batch, SEQ), np.int64)
    for row, length in enumerate(rng.integers(1, SEQ, size=batch)):
        ids[row, length:] = 0
        mask[row, length:] = 0
    mask[0] = 1
    return ids, mask


@pytest.mark.parametrize("padded", [False, True])
def test_t5_parity(t5_pair, padded):
    torch_model, jax_model = t5_pair
    ids, mask = _t5_tokens(3, np.random.default_rng(3))
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids),
                           attention_mask=torch.from_numpy(mask) if padded else None)
        want = want.last_hidden_state
    got = _jit_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask) if padded else None)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("buckets,max_distance,length", [(8, 16, 40), (32, 128, 600)])
def test_t5_buckets_match_transformers(buckets, max_distance, length):
    pos = torch.arange(length)
    want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        pos[None, :] - pos[:, None], bidirectional=True, num_buckets=buckets,
        max_distance=max_distance)
    got = relative_position_buckets(length, length, buckets, max_distance)
    np.testing.assert_array_equal(got, want.numpy())


def test_t5_bf16_compute_tracks_fp32(t5_pair):
    _, jax_model = t5_pair
    ids, mask = _t5_tokens(2, np.random.default_rng(4))
    ref = np.asarray(_jit_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask)))
    bf16 = abstract_module(lambda: t5_conv.make_model(T5_CONFIG, dtype=jnp.bfloat16,
                                                     rngs=nnx.Rngs(0)))
    _set_params(bf16, flat_arrays(jax_model))
    got = _jit_apply(bf16, jnp.asarray(ids), jnp.asarray(mask))
    assert got.dtype == jnp.bfloat16
    err = np.max(np.abs(np.asarray(got, np.float32) - ref))
    assert err < 0.05 * np.max(np.abs(ref)), err


def test_t5_sharded_matches_torch(t5_pair):
    """Under an 8-device mesh the activation constraints apply; the numbers must not move."""
    torch_model, jax_model = t5_pair
    ids, mask = _t5_tokens(4, np.random.default_rng(5))
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    mesh = jax.make_mesh((2, 2, 2), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        got = _jit_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), want.last_hidden_state.numpy(), atol=ATOL, rtol=0)


# ---- converters -------------------------------------------------------------------------------


def _round_trip(torch_cls, hf_config, conv, dtype, tmp_path, saved_state):
    """torch save_pretrained -> safetensors -> jax -> safetensors -> torch load strict."""
    torch_model = _torch_model(torch_cls, hf_config).to(dtype)
    src = tmp_path / "src"
    torch_model.save_pretrained(src)
    with open(src / "config.json") as f:
        config = json.load(f)
    spec = spec_for(config)
    assert spec is conv.SPEC
    param_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    jax_model = abstract_module(lambda: spec.make_model(config, param_dtype=param_dtype,
                                                       rngs=nnx.Rngs(1)))
    table = spec.build_table(config)
    _set_params(jax_model, convert_to_jax(table, open_checkpoint(str(src)), flat_shapes(jax_model)))
    assert all(v.dtype == param_dtype for v in flat_params(jax_model).values())
    out = tmp_path / "out"
    save_checkpoint(convert_to_diffusers(table, flat_arrays(jax_model)), str(out),
                    stem=spec.weights_stem)
    assert os.listdir(out) == ["model.safetensors"]
    back = {k: v() for k, v in open_checkpoint(str(out)).items()}
    original = saved_state(torch_model)
    assert set(back) == set(original)
    for key, value in original.items():
        assert back[key].dtype == value.dtype, key
        np.testing.assert_array_equal(back[key].view(np.uint8), value.view(np.uint8), err_msg=key)
    reloaded = torch_cls(hf_config).to(dtype)
    tensors = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)
               if v.dtype == ml_dtypes.bfloat16 else torch.from_numpy(v) for k, v in back.items()}
    if torch_cls in (transformers.T5EncoderModel, transformers.UMT5EncoderModel):  # tied copy
        tensors[t5_conv.TIED_COPY] = tensors["shared.weight"]
    reloaded.load_state_dict(tensors, strict=True)
    for key, value in torch_model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_clip_round_trip_bit_identical(dtype, tmp_path):
    cfg = CLIP_CONFIGS["quick_gelu"]
    _round_trip(transformers.CLIPTextModelWithProjection, transformers.CLIPTextConfig(**cfg),
                clip_conv, dtype, tmp_path, _numpy_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_t5_round_trip_bit_identical(dtype, tmp_path):
    _round_trip(transformers.T5EncoderModel, transformers.T5Config(**T5_CONFIG),
                t5_conv, dtype, tmp_path, _t5_saved_state)


def test_t5_tied_copy_is_folded():
    torch_model = _torch_model(transformers.T5EncoderModel, transformers.T5Config(**T5_CONFIG))
    state = _numpy_state(torch_model)  # holds both shared.weight and the tied copy
    table = t5_conv.build_table(T5_CONFIG)
    with pytest.raises(ConversionError, match=t5_conv.TIED_COPY.replace(".", r"\.")):
        convert_to_jax(table, _loaders(state))
    flat = convert_to_jax(table, t5_conv.drop_tied_copy(_loaders(state)))
    np.testing.assert_array_equal(flat["shared"], state["shared.weight"])


@pytest.mark.parametrize("which", ["clip", "t5"])
def test_missing_extra_and_misshaped_keys_are_named(which):
    if which == "clip":
        cfg = CLIP_CONFIGS["quick_gelu"]
        torch_model = _torch_model(transformers.CLIPTextModelWithProjection,
                                   transformers.CLIPTextConfig(**cfg))
        conv, state = clip_conv, _numpy_state(torch_model)
    else:
        cfg = T5_CONFIG
        torch_model = _torch_model(transformers.T5EncoderModel, transformers.T5Config(**cfg))
        conv, state = t5_conv, _t5_saved_state(torch_model)
    table = conv.build_table(cfg)
    shapes = flat_shapes(abstract_module(lambda: conv.make_model(cfg, rngs=nnx.Rngs(0))))
    victim = sorted(state)[len(state) // 2]

    missing = {k: v for k, v in state.items() if k != victim}
    with pytest.raises(ConversionError, match=f"missing keys: .*{victim}"):
        convert_to_jax(table, _loaders(missing), shapes)
    with pytest.raises(ConversionError, match="unexpected keys: .*bogus.weight"):
        convert_to_jax(table, _loaders({**state, "bogus.weight": np.zeros(3, np.float32)}), shapes)
    bad = dict(state)
    bad[victim] = np.zeros(state[victim].shape + (2,), state[victim].dtype)
    with pytest.raises(ConversionError, match=f"wrong shape for {victim}"):
        convert_to_jax(table, _loaders(bad), shapes)
    # every model parameter is mapped, and the table names nothing the model lacks
    assert {r.jax for r in table} == set(shapes)


@pytest.fixture(scope="module")
def t5_reference():
    """A tiny T5 and its parameters converted from the keys plain save_pretrained writes."""
    torch_model = _torch_model(transformers.T5EncoderModel, transformers.T5Config(**T5_CONFIG))
    table = t5_conv.build_table(T5_CONFIG)
    return torch_model, convert_to_jax(table, _loaders(_t5_saved_state(torch_model)))


def _save_t5(torch_model, directory, layout: str) -> str:
    """save_pretrained in one tied-weights layout: "shared" (what it writes by default),
    "both" (ties saved both ways: distinct tensors, equal values), "copy" (only the tied copy),
    "differ" (both keys, the copy perturbed)."""
    state = {k: v.clone() for k, v in torch_model.state_dict().items()}  # clones: no aliasing
    if layout == "copy":
        del state[t5_conv.SHARED]
    if layout == "differ":
        state[t5_conv.TIED_COPY][3, 5] += 1.0
    torch_model.save_pretrained(directory, state_dict=None if layout == "shared" else state)
    return str(directory)


@pytest.mark.parametrize("layout, stored", [
    ("shared", {t5_conv.SHARED}), ("both", {t5_conv.SHARED, t5_conv.TIED_COPY}),
    ("copy", {t5_conv.TIED_COPY})])
def test_t5_loads_every_tied_layout_transformers_writes(t5_reference, tmp_path, layout, stored):
    """Each layout loads (sharded, so the copy check runs per slice) to the same parameters,
    through load_model and through `python -m converters to-jax`."""
    from converters import jax_state
    from converters.cli import main
    from converters.loading import load_model
    from converters.safetensors_io import checkpoint_meta
    from wfm_jax.core.mesh import make_mesh
    torch_model, want = t5_reference
    src = _save_t5(torch_model, tmp_path / layout, layout)
    keys = set(checkpoint_meta(src))
    assert keys & {t5_conv.SHARED, t5_conv.TIED_COPY} == stored
    model, _ = load_model(src, component="text_encoder_3", mesh=make_mesh(fsdp=8))
    got = flat_arrays(model)
    assert set(got) == set(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert main(["to-jax", src, str(tmp_path / "state")]) == 0
    state = jax_state.restore_state(str(tmp_path / "state"), keys=["shared"])
    np.testing.assert_array_equal(state["shared"], want["shared"])


def test_t5_tied_keys_with_different_values_are_refused(t5_reference, tmp_path, capsys):
    from converters.cli import main
    from converters.loading import load_model
    torch_model, _ = t5_reference
    src = _save_t5(torch_model, tmp_path / "differ", "differ")
    needle = (rf"tied keys {t5_conv.SHARED} and {t5_conv.TIED_COPY} hold different "
              rf"values").replace(".", r"\.")
    with pytest.raises(ConversionError, match=needle):
        load_model(src)
    assert main(["to-jax", src, str(tmp_path / "state")]) == 1
    assert t5_conv.TIED_COPY in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "state")
    # drop_tied_copy (in-memory loaders) refuses them too
    state = _numpy_state(torch_model)
    state[t5_conv.TIED_COPY] = state[t5_conv.TIED_COPY] + 1
    with pytest.raises(ConversionError, match=needle):
        convert_to_jax(t5_conv.build_table(T5_CONFIG), t5_conv.drop_tied_copy(_loaders(state)))


def test_t5_tied_copy_with_another_shape_is_named_before_reading(tmp_path, monkeypatch):
    from converters import loading
    torch_model = _torch_model(transformers.T5EncoderModel, transformers.T5Config(**T5_CONFIG))
    state = _numpy_state(torch_model)
    state[t5_conv.TIED_COPY] = state[t5_conv.TIED_COPY][:-1]
    save_checkpoint(state, str(tmp_path), stem="model")
    (tmp_path / "config.json").write_text(json.dumps(
        dict(torch_model.config.to_dict(), architectures=["T5EncoderModel"])))
    monkeypatch.setattr(loading, "open_checkpoint_slices", None)  # any read would fail
    with pytest.raises(ConversionError, match="tied keys shared.weight .*encoder.embed_tokens"):
        loading.load_model(str(tmp_path))


# ---- UMT5 (Wan's text encoder): T5 with one relative-position bias table per layer -----------

UMT5_CONFIG = dict(T5_CONFIG, num_layers=3)


@pytest.fixture(scope="module")
def umt5_pair():
    torch_model = _torch_model(transformers.UMT5EncoderModel, transformers.UMT5Config(**UMT5_CONFIG))
    with torch.no_grad():  # distinct tables per layer, so a shared-table port cannot pass
        for block in torch_model.encoder.block:
            block.layer[0].SelfAttention.relative_attention_bias.weight.normal_(0.0, 0.5)
    table = t5_conv.build_umt5_table(UMT5_CONFIG)
    jax_model = _jax_model(t5_conv.make_umt5_model, UMT5_CONFIG, table,
                           _t5_saved_state(torch_model))
    return torch_model, jax_model


@pytest.mark.parametrize("padded", [False, True])
def test_umt5_parity(umt5_pair, padded):
    torch_model, jax_model = umt5_pair
    ids, mask = _t5_tokens(3, np.random.default_rng(6))
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids),
                           attention_mask=torch.from_numpy(mask) if padded else None)
    got = np.asarray(_jit_apply(jax_model, jnp.asarray(ids), jnp.asarray(mask) if padded else None))
    err = float(np.max(np.abs(got - want.last_hidden_state.numpy())))
    print(f"umt5 padded={padded} max abs err {err:.3g}")
    assert err <= ATOL


def test_umt5_table_matches_state_dict_and_spec():
    torch_model = _torch_model(transformers.UMT5EncoderModel, transformers.UMT5Config(**UMT5_CONFIG))
    table = t5_conv.build_umt5_table(UMT5_CONFIG)
    assert {r.hf for r in table} == set(_t5_saved_state(torch_model))
    assert len({r.jax for r in table}) == len(table)
    model = abstract_module(lambda: t5_conv.make_umt5_model(UMT5_CONFIG, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))
    assert spec_for({"architectures": ["UMT5EncoderModel"]}) is t5_conv.UMT5_SPEC
    # a T5 checkpoint (one shared table) is not a UMT5 one: the missing tables are named
    t5_state = _t5_saved_state(_torch_model(transformers.T5EncoderModel,
                                            transformers.T5Config(**UMT5_CONFIG)))
    with pytest.raises(ConversionError, match="block.1.layer.0.SelfAttention.relative_attention"):
        convert_to_jax(table, _loaders(t5_state), flat_shapes(model))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_umt5_round_trip_bit_identical(dtype, tmp_path):
    _round_trip(transformers.UMT5EncoderModel, transformers.UMT5Config(**UMT5_CONFIG),
                SimpleNamespace(SPEC=t5_conv.UMT5_SPEC), dtype, tmp_path, _t5_saved_state)


def test_umt5_cli_round_trip_bit_identical(tmp_path):
    """`python -m converters to-jax | to-diffusers` on a transformers UMT5 save."""
    from converters.cli import main as converters_main
    torch_model = _torch_model(transformers.UMT5EncoderModel, transformers.UMT5Config(**UMT5_CONFIG))
    torch_model.to(torch.bfloat16).save_pretrained(tmp_path / "src")
    assert converters_main(["to-jax", str(tmp_path / "src"), str(tmp_path / "jax")]) == 0
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    want = {k: v() for k, v in open_checkpoint(str(tmp_path / "src")).items()}
    got = {k: v() for k, v in open_checkpoint(str(tmp_path / "back")).items()}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key
    back = transformers.UMT5EncoderModel.from_pretrained(str(tmp_path / "back"))
    assert back.config.num_layers == UMT5_CONFIG["num_layers"]
