"""Wan DiT (WanTransformer3DModel): forward parity with diffusers, the converter table both
ways (in memory and through `python -m converters`), remat, and the released configs.

Tiny random diffusers models with every weight re-drawn (norm weights and biases too, so a
swapped mapping shows) go through the converter into the wfm_jax model; the forward must match
torch in fp32 to 2e-5. Two variants: patch (1, 2, 2) with the cross-attention norm, and patch
(2, 2, 2) without it (exercises the temporal patching and unpatchify order).
diffusers' forward takes no text attention mask (the pipeline feeds zero-padded UMT5 rows that
are attended), so there is no masked variant to compare.
"""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel
from flax import nnx
from safetensors import safe_open

from converters import jax_state
from converters.cli import main as converters_main
from converters.wan_transformer import build_table, make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from converters.loading import check_against_model
from wfm_jax.models.layers.remat import REMAT_POLICIES
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes
from wfm_jax.models.wan import WAN21_T2V_1_3B, WAN21_T2V_14B, WanTransformer
from wfm_jax.models.wan.rope import rope_tables

BASE = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
            out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)
VARIANTS = {
    "p122_norm": {},
    "p222_no_norm": dict(patch_size=(2, 2, 2), cross_attn_norm=False, out_channels=3),
}
SHAPE = (2, 4, 4, 8, 6)  # (B, C, T, H, W): grid (4|2, 4, 3), non-square
TEXT_LEN = 7
TIMESTEPS = np.array([999, 517], np.int64)  # what the pipeline feeds: int64 ~ 1000 sigma
ATOL = 2e-5
BF16_REL_TOL = 2e-2  # as the SD3 test: ~10 chained bf16 roundings measure well under 1%


def _torch_model(variant: str):
    config = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    model = WanTransformer3DModel(**config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # norm weights stay near 1, everything else near 0
            base = 1.0 if p.ndim == 1 and bool((p == 1).all()) else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return config, model


def _numpy_state(model, dtype=torch.float32):
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(dtype).contiguous()
        out[k] = (v.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16
                  else v.numpy())
    return out


def _loaders(tensors):
    return {k: (lambda v=v: v) for k, v in tensors.items()}


def _jax_model(config, tensors, *, dtype=None, param_dtype=jnp.float32, **options):
    model = nnx.eval_shape(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0), **options))
    flat = convert_to_jax(build_table(config), _loaders(tensors), flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], param_dtype))
    return model


def _inputs(config):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SHAPE[:1] + (config["in_channels"],) + SHAPE[2:], np.float32),
            TIMESTEPS,
            rng.standard_normal((SHAPE[0], TEXT_LEN, config["text_dim"]), np.float32))


def _jit_forward(model):
    graph, state = nnx.split(model)
    fn = jax.jit(lambda s, *a: nnx.merge(graph, s)(*a))
    return lambda *a: np.asarray(fn(state, *a))


@functools.lru_cache(maxsize=None)
def _case(variant: str) -> dict:
    config, torch_model = _torch_model(variant)
    inputs = _inputs(config)
    with torch.no_grad():
        want = torch_model(torch.from_numpy(inputs[0]), torch.from_numpy(inputs[1]),
                           torch.from_numpy(inputs[2]), return_dict=False)[0].numpy()
    return dict(variant=variant, config=config, torch_model=torch_model,
                tensors=_numpy_state(torch_model), inputs=inputs, want=want)


@pytest.fixture(params=list(VARIANTS))
def case(request):
    return _case(request.param)


def test_forward_matches_diffusers_fp32(case):
    got = _jit_forward(_jax_model(case["config"], case["tensors"]))(*case["inputs"])
    assert got.shape == case["want"].shape
    err = float(np.max(np.abs(got - case["want"])))
    print(f"wan transformer {case['variant']} fp32 max abs err {err:.3g}")
    assert err <= ATOL, f"{case['variant']}: max abs diff {err:.3g}"


def test_bf16_compute_close_to_fp32_and_to_diffusers_bf16(tmp_path):
    """bf16 compute with fp32 master weights: within 2% of fp32, and no further from it than
    twice what diffusers' own bf16 model (its fp32 modules kept, as from_pretrained does) is
    (measured: 0.73% vs 0.59%)."""
    case = _case("p122_norm")
    model = _jax_model(case["config"], case["tensors"], dtype=jnp.bfloat16)
    got = _jit_forward(model)(*case["inputs"])
    assert got.dtype == jnp.bfloat16
    got, want = got.astype(np.float32), case["want"]
    scale = np.max(np.abs(want))
    rel = np.max(np.abs(got - want)) / scale
    assert np.all(np.isfinite(got)) and rel <= BF16_REL_TOL, rel
    case["torch_model"].save_pretrained(tmp_path)
    ref = WanTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    assert ref.blocks[0].scale_shift_table.dtype == torch.float32  # its fp32 islands
    x, t, text = (torch.from_numpy(a) for a in case["inputs"])
    with torch.no_grad():
        theirs = ref(x.bfloat16(), t, text.bfloat16(), return_dict=False)[0].float().numpy()
    ref_rel = np.max(np.abs(theirs - want)) / scale
    assert rel <= 2 * ref_rel, (rel, ref_rel)


def test_rope_tables_equal_diffusers():
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    head_dim, grid = 128, (5, 7, 6)
    rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), 1024)
    cos_t, sin_t = rope(torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2]))
    cos, sin = rope_tables(head_dim, grid, 1024)
    # diffusers repeats each angle for the pair; the tables hold each once
    np.testing.assert_array_equal(cos, cos_t[0, :, 0, 0::2].numpy())
    np.testing.assert_array_equal(sin, sin_t[0, :, 0, 1::2].numpy())
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        rope_tables(head_dim, (2, 40, 3), 32)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_table_maps_every_key_exactly_once(variant):
    config = {**BASE, **VARIANTS[variant]}
    table = build_table(config)
    assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
    assert {r.hf for r in table} == set(WanTransformer3DModel(**config).state_dict())
    model = nnx.eval_shape(lambda: WanTransformer(config, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))


def test_every_parameter_has_logical_axes():
    params = flat_params(nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0))))
    for key, var in params.items():
        axes = getattr(var, "out_sharding", None)
        assert axes is not None and len(axes) == len(var.shape), key
    assert params["blocks.0.attn1.to_q.kernel"].out_sharding == ("embed", "heads")
    assert params["blocks.1.attn2.to_out.0.kernel"].out_sharding == ("heads", "embed")
    assert params["blocks.0.ffn.net.0.proj.kernel"].out_sharding == ("embed", "mlp")
    assert params["blocks.0.attn1.norm_q.scale"].out_sharding == ("heads",)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_identical_and_loads_in_diffusers(case, dtype):
    torch_dtype = getattr(torch, dtype)
    tensors = _numpy_state(case["torch_model"], torch_dtype)
    model = _jax_model(case["config"], tensors, param_dtype=jnp.dtype(dtype))
    back = convert_to_diffusers(build_table(case["config"]), flat_arrays(model))
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), f"{key} changed in the round trip"
    reloaded = WanTransformer3DModel(**case["config"]).to(torch_dtype)
    state = {k: (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
                 if dtype == "bfloat16" else torch.from_numpy(v.copy())) for k, v in back.items()}
    reloaded.load_state_dict(state, strict=True)


def _raw(directory):
    out = {}
    with safe_open(os.path.join(directory, "diffusion_pytorch_model.safetensors"), "numpy") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            out[key] = (piece.get_dtype(), tuple(piece.get_shape()), f.get_tensor(key).tobytes())
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_round_trip_bit_identical(tmp_path, capsys, dtype):
    torch_model = _case("p122_norm")["torch_model"]
    src = tmp_path / "src"
    torch_model.to(getattr(torch, dtype)).save_pretrained(src)
    torch_model.to(torch.float32)
    assert converters_main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
    stored = {np.dtype(d).name for _, d in jax_state.state_meta(str(tmp_path / "jax")).values()}
    assert stored == {dtype}
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert _raw(src) == _raw(tmp_path / "back")
    config = json.load(open(tmp_path / "back" / "config.json"))
    assert config["_class_name"] == "WanTransformer3DModel"
    WanTransformer3DModel.from_pretrained(str(tmp_path / "back"))  # diffusers loads it
    # a missing key is one line naming it, nothing written
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "diffusion_pytorch_model.safetensors"))
    del tensors["blocks.1.attn2.norm_k.weight"]
    save_file(tensors, str(src / "diffusion_pytorch_model.safetensors"))
    capsys.readouterr()
    assert converters_main(["to-jax", str(src), str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "blocks.1.attn2.norm_k.weight" in err
    assert not (tmp_path / "bad").exists()


def test_bad_checkpoints_name_the_key():
    case = _case("p122_norm")
    config, tensors = case["config"], case["tensors"]
    table = build_table(config)
    shapes = flat_shapes(nnx.eval_shape(lambda: WanTransformer(config, rngs=nnx.Rngs(0))))
    key = "blocks.0.attn1.to_q.weight"
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders({k: v for k, v in tensors.items() if k != key}), shapes)
    with pytest.raises(ConversionError, match="blocks.0.attn1.bogus"):
        convert_to_jax(table, _loaders({**tensors, "blocks.0.attn1.bogus": tensors[key]}), shapes)
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders({**tensors, key: np.zeros((3, 24), np.float32)}), shapes)
    # a checkpoint without the cross-attention norm has keys this table lacks and vice versa
    other = _case("p222_no_norm")["tensors"]
    with pytest.raises(ConversionError, match="norm2"):
        convert_to_jax(table, _loaders(other), shapes)


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _eqns(sub)


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_remat_checkpoints_each_block_with_its_policy(remat):
    model = nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0), remat=remat))
    graph, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, *a: nnx.merge(graph, s)(*a))(state, *_inputs(BASE)).jaxpr
    checkpoints = [e for e in _eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    if remat == "none":
        assert not checkpoints
    else:
        assert len(checkpoints) == BASE["num_layers"]
        assert all(e.params["policy"] is REMAT_POLICIES[remat] for e in checkpoints)


@pytest.mark.slow  # two backward compiles, ~50 s on a shared 2-core box
def test_remat_matches_no_remat_values_and_grads():
    case = _case("p122_norm")
    x, t, text = case["inputs"]

    def value_and_grad(remat):
        model = _jax_model(case["config"], case["tensors"], remat=remat)
        graph, state = nnx.split(model)
        loss = lambda s: jnp.sum(nnx.merge(graph, s)(x, t, text) ** 2)
        return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0), (v1, g1) = value_and_grad("none"), value_and_grad("full")
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)


@pytest.mark.parametrize("name, config", [("1.3B", WAN21_T2V_1_3B), ("14B", WAN21_T2V_14B)])
def test_released_configs_match_diffusers_shapes(name, config):
    """The configs as data: the same parameter shapes as diffusers builds (meta tensors), and the
    released parameter count. Built with one block (the blocks are identical) to stay fast."""
    one = {**config, "num_layers": 1}
    with torch.device("meta"):
        ref = {k: tuple(v.shape) for k, v in WanTransformer3DModel(**one).state_dict().items()}
    model = nnx.eval_shape(lambda: WanTransformer(one, rngs=nnx.Rngs(0)))
    check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
    sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
    block = sum(v for k, v in sizes.items() if k.startswith("blocks.0."))
    total = sum(sizes.values()) + (config["num_layers"] - 1) * block
    assert abs(total / 1e9 - {"1.3B": 1.419, "14B": 14.29}[name]) < 0.01  # spec §0 [meas]


def test_bad_options_and_inputs_fail_clearly():
    with pytest.raises(ValueError, match="image-to-video"):
        nnx.eval_shape(lambda: WanTransformer({**BASE, "image_dim": 16}, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="remat"):
        nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0), remat="some"))
    with pytest.raises(ValueError, match="cudnn"):
        nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0), attention_impl="cudnn"))
    model = nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0)))
    graph, state = nnx.split(model)
    _, t, text = _inputs(BASE)
    odd = np.zeros((2, 4, 3, 7, 6), np.float32)  # H=7 not divisible by patch 2
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        jax.eval_shape(lambda s: nnx.merge(graph, s)(odd, t, text), state)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_forward_matches_diffusers():
    """Weights on their logical shards (embed over fsdp), batch over data, the token sequence
    over context: the numbers must not move."""
    from wfm_jax.core.mesh import make_mesh, param_shardings
    case = _case("p122_norm")
    model = _jax_model(case["config"], case["tensors"])
    mesh = make_mesh(data=2, fsdp=2, context=2)
    graph, state = nnx.split(model)
    shardings = param_shardings(model, mesh)
    flat = dict(nnx.to_flat_state(state))
    for path, var in flat.items():
        key = ".".join(map(str, path))
        var.set_value(jax.device_put(var.get_value(), shardings[key]))
    placed = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}
    assert "fsdp" in str(placed["blocks.0.attn1.to_q.kernel"].sharding.spec)
    with jax.set_mesh(mesh):
        got = np.asarray(jax.jit(lambda s, *a: nnx.merge(graph, s)(*a))(state, *case["inputs"]))
    err = float(np.max(np.abs(got - case["want"])))
    assert err <= ATOL, err


def test_lora_targets_address_diffusers_module_names():
    """The Wan LoRA list (spec video_models.md §5.5) finds the same layers peft would."""
    from wfm_jax.models.lora import find_targets
    model = nnx.eval_shape(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0)))
    found = find_targets(model, ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj",
                                 "ffn.net.2"])
    assert len(found) == BASE["num_layers"] * (2 * 4 + 2)
    assert "blocks.1.attn2.to_out.0" in found and "blocks.0.ffn.net.2" in found
    assert not any(p.startswith("condition_embedder") for p in found)
