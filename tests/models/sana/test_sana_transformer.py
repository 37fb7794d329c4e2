"""SANA1.5 DiT (SanaTransformer2DModel): forward parity with diffusers on a padded text mask,
the converter table both ways (in memory and through `python -m converters`), remat, the
released config, sharding, and the linear attention against its quadratic definition.

Two variants: the spec's tiny config (§4.3: patch 1, q/k RMS norm across heads), and one that
switches on every optional key (patch 2, guidance embedding, sincos position embedding, affine
norm2, q/k/v biases, no q/k norm).
"""
from __future__ import annotations

import copy
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import SanaTransformer2DModel
from flax import nnx

from converters import jax_state
from converters.cli import main as converters_main
from converters.sana_transformer import build_table, make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from tests import _sana as S
from wfm_jax.models.layers.remat import REMAT_POLICIES
from converters.loading import check_against_model
from wfm_jax.models.sana import SANA15_1600M, SanaTransformer
from wfm_jax.models.sana.linear_attention import linear_attention
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes

BASE = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
            num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=8,
            cross_attention_dim=16, caption_channels=16, mlp_ratio=2.5, sample_size=8,
            patch_size=1, qk_norm="rms_norm_across_heads", timestep_scale=1.0)
VARIANTS = {
    "tiny": {},
    "p2_all_options": dict(patch_size=2, out_channels=3, guidance_embeds=True,
                           interpolation_scale=1.0, norm_elementwise_affine=True,
                           attention_bias=True, qk_norm=None),
}
SHAPE = (2, 4, 8, 6)  # (B, C, H, W): non-square


def _inputs(config, mask=True):
    rng = np.random.default_rng(0)
    out = dict(hidden_states=rng.standard_normal(SHAPE, np.float32),
               encoder_hidden_states=rng.standard_normal((2, S.TEXT_LEN, 16), np.float32),
               timestep=S.TIMESTEPS)
    if mask:
        out["encoder_attention_mask"] = S.MASK
    if config.get("guidance_embeds"):
        out["guidance"] = np.array([4.5, 0.3], np.float32)
    return out


@functools.lru_cache(maxsize=None)
def _case(variant: str) -> dict:
    config = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    torch_model = S.randomise(SanaTransformer2DModel(**config).eval())
    inputs = _inputs(config)
    return dict(variant=variant, config=config, torch_model=torch_model, inputs=inputs,
                tensors=S.numpy_state(torch_model), want=S.torch_forward(torch_model, inputs))


def _model(case, **kw):
    return S.jax_model(make_model, build_table, case["config"], case["tensors"], **kw)


@pytest.fixture(params=list(VARIANTS))
def case(request):
    return _case(request.param)


def test_forward_matches_diffusers_fp32(case):
    got = S.jit_forward(_model(case))(**case["inputs"])
    assert got.shape == case["want"].shape
    err = float(np.max(np.abs(got - case["want"])))
    print(f"sana {case['variant']} fp32 max abs err {err:.3g}")
    assert err <= S.ATOL, f"{case['variant']}: max abs diff {err:.3g}"


def test_text_mask_is_applied_and_self_attention_mask_refused():
    """The padded mask changes the output (so the parity above tests it), as in diffusers; the
    self-attention `attention_mask`, which diffusers silently ignores, is refused."""
    case = _case("tiny")
    forward = S.jit_forward(_model(case))
    unmasked = _inputs(case["config"], mask=False)
    got = forward(**unmasked)
    want = S.torch_forward(case["torch_model"], unmasked)
    assert float(np.max(np.abs(got - want))) <= S.ATOL
    assert float(np.max(np.abs(got - case["want"]))) > 1e-2
    with pytest.raises(ValueError, match="encoder_attention_mask"):
        _model(case)(**unmasked, attention_mask=S.MASK)


def test_bf16_compute_close_to_fp32_and_to_diffusers_bf16(tmp_path):
    """bf16 compute, fp32 master weights: within 2% of fp32 and no further than twice diffusers'
    own bf16 model."""
    case = _case("tiny")
    got = S.jit_forward(_model(case, dtype=jnp.bfloat16))(**case["inputs"])
    assert got.dtype == jnp.bfloat16
    got, want = got.astype(np.float32), case["want"]
    scale = np.max(np.abs(want))
    rel = np.max(np.abs(got - want)) / scale
    assert np.all(np.isfinite(got)) and rel <= S.BF16_REL_TOL, rel
    case["torch_model"].save_pretrained(tmp_path)
    ref = SanaTransformer2DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    kw = {k: torch.from_numpy(np.asarray(v)) for k, v in case["inputs"].items()}
    kw["hidden_states"], kw["encoder_hidden_states"] = (
        kw["hidden_states"].bfloat16(), kw["encoder_hidden_states"].bfloat16())
    with torch.no_grad():
        theirs = ref(**kw, return_dict=False)[0].float().numpy()
    ref_rel = np.max(np.abs(theirs - want)) / scale
    print(f"bf16 rel err: wfm_jax {rel:.3g}, diffusers {ref_rel:.3g}")
    assert rel <= 2 * ref_rel, (rel, ref_rel)


def test_linear_attention_equals_its_quadratic_form():
    """out_n = sum_m (q_n . k_m) v_m / (sum_m q_n . k_m + 1e-15) with q, k >= 0."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 11, 3, 5)).astype(np.float32) for _ in range(3))
    q, k = np.maximum(q, 0), np.maximum(k, 0)
    scores = np.einsum("bnhd,bmhd->bhnm", q.astype(np.float64), k)
    want = np.einsum("bhnm,bmhe->bnhe", scores, v) / (scores.sum(-1).transpose(0, 2, 1)[..., None]
                                                       + 1e-15)
    np.testing.assert_allclose(np.asarray(linear_attention(q, k, v)), want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_table_maps_every_key_exactly_once(variant):
    config = {**BASE, **VARIANTS[variant]}
    table = build_table(config)
    assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
    assert {r.hf for r in table} == set(SanaTransformer2DModel(**config).state_dict())
    model = nnx.eval_shape(lambda: SanaTransformer(config, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))


def test_every_parameter_has_logical_axes():
    config = {**BASE, **VARIANTS["p2_all_options"]}
    params = flat_params(nnx.eval_shape(lambda: SanaTransformer(config, rngs=nnx.Rngs(0))))
    for key, var in params.items():
        axes = getattr(var, "out_sharding", None)
        assert axes is not None and len(axes) == len(var.shape), key
    b = "transformer_blocks.0"
    assert params[f"{b}.attn1.to_q.kernel"].out_sharding == ("embed", "heads")
    assert params[f"{b}.attn2.to_out.0.kernel"].out_sharding == ("heads", "embed")
    assert params[f"{b}.ff.conv_inverted.kernel"].out_sharding == (None, None, "embed", "mlp")
    assert params[f"{b}.ff.conv_point.kernel"].out_sharding == (None, None, "mlp", "embed")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_identical_and_loads_in_diffusers(case, dtype):
    torch_dtype = getattr(torch, dtype)
    tensors = S.numpy_state(case["torch_model"], torch_dtype)
    model = S.jax_model(make_model, build_table, case["config"], tensors,
                        param_dtype=jnp.dtype(dtype))
    back = convert_to_diffusers(build_table(case["config"]), flat_arrays(model))
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), f"{key} changed in the round trip"
    reloaded = SanaTransformer2DModel(**case["config"]).to(torch_dtype)
    reloaded.load_state_dict(S.torch_state(back, dtype), strict=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_round_trip_bit_identical(tmp_path, capsys, dtype):
    torch_model = copy.deepcopy(_case("p2_all_options")["torch_model"])  # the cache stays fp32
    src = tmp_path / "src"
    torch_model.to(getattr(torch, dtype)).save_pretrained(src)
    assert converters_main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
    stored = {np.dtype(d).name for _, d in jax_state.state_meta(str(tmp_path / "jax")).values()}
    assert stored == {dtype}
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert S.raw_safetensors(src) == S.raw_safetensors(tmp_path / "back")
    config = json.load(open(tmp_path / "back" / "config.json"))
    assert config["_class_name"] == "SanaTransformer2DModel"
    SanaTransformer2DModel.from_pretrained(str(tmp_path / "back"))
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "diffusion_pytorch_model.safetensors"))
    del tensors["transformer_blocks.1.ff.conv_depth.bias"]
    save_file(tensors, str(src / "diffusion_pytorch_model.safetensors"))
    capsys.readouterr()
    assert converters_main(["to-jax", str(src), str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "transformer_blocks.1.ff.conv_depth.bias" in err
    assert not (tmp_path / "bad").exists()


def test_load_transformer_from_a_diffusers_dir(tmp_path):
    """`wfm_jax.models.load_transformer` serves the class by its config and takes diffusers'
    keyword arguments."""
    from wfm_jax.models import load_transformer
    case = _case("p2_all_options")
    case["torch_model"].save_pretrained(tmp_path)
    model = load_transformer(str(tmp_path))
    assert isinstance(model, SanaTransformer)
    got = S.jit_forward(model)(**case["inputs"])
    assert float(np.max(np.abs(got - case["want"]))) <= S.ATOL


def test_bad_checkpoints_name_the_key():
    case = _case("tiny")
    config, tensors = case["config"], case["tensors"]
    table = build_table(config)
    shapes = flat_shapes(nnx.eval_shape(lambda: SanaTransformer(config, rngs=nnx.Rngs(0))))
    key = "transformer_blocks.0.attn1.to_q.weight"
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, S.loaders({k: v for k, v in tensors.items() if k != key}), shapes)
    with pytest.raises(ConversionError, match="transformer_blocks.0.attn1.bogus"):
        convert_to_jax(table, S.loaders({**tensors, "transformer_blocks.0.attn1.bogus":
                                         tensors[key]}), shapes)
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, S.loaders({**tensors, key: np.zeros((3, 16), np.float32)}), shapes)
    other = _case("p2_all_options")["tensors"]  # guidance embedder, biases, no q/k norms
    with pytest.raises(ConversionError, match="guidance_embedder"):
        convert_to_jax(table, S.loaders(other), shapes)


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_remat_checkpoints_each_block_with_its_policy(remat):
    model = nnx.eval_shape(lambda: SanaTransformer(BASE, rngs=nnx.Rngs(0), remat=remat))
    graph, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, _inputs(BASE)).jaxpr
    checkpoints = [e for e in S.eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    if remat == "none":
        assert not checkpoints
    else:
        assert len(checkpoints) == BASE["num_layers"]
        assert all(e.params["policy"] is REMAT_POLICIES[remat] for e in checkpoints)


def test_remat_matches_no_remat_values_and_grads():
    case = _case("tiny")
    inputs = case["inputs"]

    def value_and_grad(remat):
        graph, state = nnx.split(_model(case, remat=remat))
        loss = lambda s: jnp.sum(nnx.merge(graph, s)(**inputs) ** 2)
        return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0), (v1, g1) = value_and_grad("none"), value_and_grad("full")
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)


def test_released_config_matches_diffusers_shapes():
    """SANA1.5 1.6B as data: diffusers' parameter shapes (meta tensors) and the released count
    (spec §0: 1.605B). Built with one block (the blocks are identical)."""
    one = {**SANA15_1600M, "num_layers": 1}
    with torch.device("meta"):
        ref = {k: tuple(v.shape) for k, v in SanaTransformer2DModel(**one).state_dict().items()}
    model = nnx.eval_shape(lambda: SanaTransformer(one, rngs=nnx.Rngs(0)))
    check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
    sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
    block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
    total = sum(sizes.values()) + (SANA15_1600M["num_layers"] - 1) * block
    assert abs(total / 1e9 - 1.605) < 0.001, total


def test_bad_options_and_inputs_fail_clearly():
    def build(**kw):
        return nnx.eval_shape(lambda: SanaTransformer({**BASE, **kw}, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="qk_norm"):
        build(qk_norm="layer_norm")
    with pytest.raises(ValueError, match="cross_attention_dim"):
        build(cross_attention_dim=12)
    with pytest.raises(ValueError, match="remat"):
        nnx.eval_shape(lambda: SanaTransformer(BASE, rngs=nnx.Rngs(0), remat="some"))
    with pytest.raises(ValueError, match="attention_impl"):
        nnx.eval_shape(lambda: SanaTransformer(BASE, rngs=nnx.Rngs(0), attention_impl="cudnn"))
    graph, state = nnx.split(build())
    run = lambda **kw: jax.eval_shape(lambda s: nnx.merge(graph, s)(**{**_inputs(BASE), **kw}),
                                      state)
    with pytest.raises(ValueError, match="encoder_attention_mask must be"):
        run(encoder_attention_mask=S.MASK[:, :5])
    with pytest.raises(ValueError, match="timestep must be"):
        run(timestep=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="no guidance embedding"):
        run(guidance=np.ones(2))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        p2 = nnx.eval_shape(lambda: SanaTransformer({**BASE, "patch_size": 2}, rngs=nnx.Rngs(0)))
        graph2, state2 = nnx.split(p2)
        jax.eval_shape(lambda s: nnx.merge(graph2, s)(**{**_inputs(BASE), "hidden_states":
                                                         np.zeros((2, 4, 7, 6), np.float32)}),
                       state2)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_forward_matches_diffusers():
    """Weights on their logical shards (embed over fsdp), batch over data, tokens over context:
    the numbers must not move (the linear attention's sums over the split sequence included)."""
    from wfm_jax.core.mesh import make_mesh, param_shardings
    case = _case("tiny")
    model = _model(case)
    mesh = make_mesh(data=2, fsdp=2, context=2)
    graph, state = nnx.split(model)
    shardings = param_shardings(model, mesh)
    for path, var in nnx.to_flat_state(state):
        var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
    # batch 4 (the case twice) so it divides data x fsdp
    inputs = {k: np.concatenate([v, v]) if np.ndim(v) else v for k, v in case["inputs"].items()}
    with jax.set_mesh(mesh):
        got = np.asarray(jax.jit(lambda s, kw: nnx.merge(graph, s)(**kw))(state, inputs))
    err = float(np.max(np.abs(got - np.concatenate([case["want"]] * 2))))
    assert err <= S.ATOL, err


def test_lora_targets_address_diffusers_module_names():
    """cosmos-rl's SANA LoRA targets (spec §5.3) find the same layers peft would."""
    from wfm_jax.models.lora import find_targets
    model = nnx.eval_shape(lambda: SanaTransformer(BASE, rngs=nnx.Rngs(0)))
    found = find_targets(model, ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                 "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"])
    assert len(found) == BASE["num_layers"] * 8
    assert "transformer_blocks.1.attn2.to_out.0" in found
