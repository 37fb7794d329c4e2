"""SANA-Video DiT (SanaVideoTransformer3DModel): forward parity with diffusers on a padded text
mask (and per-token timesteps), the converter table both ways (in memory and through
`python -m converters`), remat, the released config, sharding, and the RoPE'd linear attention
against its quadratic definition.

Two variants: the spec's tiny config (§4.3: patch (1, 2, 2), q/k RMS norm across heads), and
patch (2, 2, 2) with every optional key on (guidance embedding, affine norm2, q/k/v biases, no
q/k norm), which exercises temporal patching and its unpatchify order. Both have 3 latent
frames after patching, so the temporal conv sees a frame with two neighbours.
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
from diffusers import SanaVideoTransformer3DModel
from flax import nnx

from converters import jax_state
from converters.cli import main as converters_main
from converters.sana_transformer import build_video_table as build_table
from converters.sana_transformer import make_video_model as make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from tests import _sana as S
from wfm_jax.models.layers.remat import REMAT_POLICIES
from converters.loading import check_against_model
from wfm_jax.models.sana import SANA_VIDEO_2B, SanaVideoTransformer
from wfm_jax.models.sana.linear_attention import linear_attention
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes
from wfm_jax.models.wan.rope import rope_tables

BASE = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12,
            num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=12,
            cross_attention_dim=24, caption_channels=16, mlp_ratio=3.0, sample_size=4,
            patch_size=(1, 2, 2), qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
VARIANTS = {
    "tiny": {},
    "p222_all_options": dict(patch_size=(2, 2, 2), out_channels=3, guidance_embeds=True,
                             norm_elementwise_affine=True, attention_bias=True, qk_norm=None),
}
FRAMES = {"tiny": 3, "p222_all_options": 6}  # 3 latent frames after patching either way
HW = (8, 6)  # grid 4 x 3: non-square


def _inputs(config, mask=True):
    rng = np.random.default_rng(0)
    frames = 3 * config["patch_size"][0]
    out = dict(hidden_states=rng.standard_normal((2, 4, frames, *HW), np.float32),
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
    torch_model = S.randomise(SanaVideoTransformer3DModel(**config).eval())
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
    print(f"sana-video {case['variant']} fp32 max abs err {err:.3g}")
    assert err <= S.ATOL, f"{case['variant']}: max abs diff {err:.3g}"


def test_per_token_timesteps_match_diffusers():
    """diffusers broadcasts a (B, N) timestep per token through the blocks and the final norm."""
    case = _case("tiny")
    tokens = 3 * 4 * 3
    inputs = dict(case["inputs"], timestep=np.random.default_rng(5).integers(
        0, 1000, (2, tokens)).astype(np.int64))
    want = S.torch_forward(case["torch_model"], inputs)
    got = S.jit_forward(_model(case))(**inputs)
    assert float(np.max(np.abs(got - want))) <= S.ATOL
    with pytest.raises(ValueError, match="timestep must be"):  # per frame does not broadcast
        jax.eval_shape(lambda: _model(case)(**dict(inputs, timestep=np.zeros((2, 3)))))


def test_text_mask_is_applied_and_self_attention_mask_refused():
    case = _case("tiny")
    unmasked = _inputs(case["config"], mask=False)
    got = S.jit_forward(_model(case))(**unmasked)
    assert float(np.max(np.abs(got - S.torch_forward(case["torch_model"], unmasked)))) <= S.ATOL
    assert float(np.max(np.abs(got - case["want"]))) > 1e-2
    with pytest.raises(ValueError, match="encoder_attention_mask"):
        _model(case)(**unmasked, attention_mask=S.MASK)


def test_bf16_compute_close_to_fp32_and_to_diffusers_bf16(tmp_path):
    case = _case("tiny")
    got = S.jit_forward(_model(case, dtype=jnp.bfloat16))(**case["inputs"])
    assert got.dtype == jnp.bfloat16
    got, want = got.astype(np.float32), case["want"]
    scale = np.max(np.abs(want))
    rel = np.max(np.abs(got - want)) / scale
    assert np.all(np.isfinite(got)) and rel <= S.BF16_REL_TOL, rel
    case["torch_model"].save_pretrained(tmp_path)
    ref = SanaVideoTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    kw = {k: torch.from_numpy(np.asarray(v)) for k, v in case["inputs"].items()}
    kw["hidden_states"], kw["encoder_hidden_states"] = (
        kw["hidden_states"].bfloat16(), kw["encoder_hidden_states"].bfloat16())
    with torch.no_grad():
        theirs = ref(**kw, return_dict=False)[0].float().numpy()
    ref_rel = np.max(np.abs(theirs - want)) / scale
    print(f"bf16 rel err: wfm_jax {rel:.3g}, diffusers {ref_rel:.3g}")
    assert rel <= 2 * ref_rel, (rel, ref_rel)


def test_rope_linear_attention_equals_its_quadratic_form():
    """Numerator with rotated q, k; normaliser with the un-rotated ones (diffusers'
    SanaLinearAttnProcessor3_0): out_n = sum_m (Rq_n . Rk_m) v_m / (sum_m q_n . k_m + 1e-15)."""
    rng = np.random.default_rng(3)
    grid, d = (2, 3, 2), 12
    q, k, v = (rng.standard_normal((2, 12, 3, d)).astype(np.float32) for _ in range(3))
    q, k = np.maximum(q, 0), np.maximum(k, 0)
    cos, sin = (t.astype(np.float64) for t in rope_tables(d, grid, 32))

    def rot(x):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos[None, :, None], sin[None, :, None]
        return np.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(x.shape)

    num = np.einsum("bnhd,bmhd->bhnm", rot(q.astype(np.float64)), rot(k.astype(np.float64)))
    den = np.einsum("bnhd,bmhd->bnh", q.astype(np.float64), k)
    want = np.einsum("bhnm,bmhe->bnhe", num, v) / (den[..., None] + 1e-15)
    got = linear_attention(q, k, v, (jnp.asarray(cos, jnp.float32), jnp.asarray(sin, jnp.float32)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_table_maps_every_key_exactly_once(variant):
    config = {**BASE, **VARIANTS[variant]}
    table = build_table(config)
    assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
    assert {r.hf for r in table} == set(SanaVideoTransformer3DModel(**config).state_dict())
    model = nnx.eval_shape(lambda: SanaVideoTransformer(config, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))


def test_every_parameter_has_logical_axes():
    params = flat_params(nnx.eval_shape(lambda: SanaVideoTransformer(BASE, rngs=nnx.Rngs(0))))
    for key, var in params.items():
        axes = getattr(var, "out_sharding", None)
        assert axes is not None and len(axes) == len(var.shape), key
    assert params["transformer_blocks.0.ff.conv_temp.kernel"].out_sharding == (
        None, None, "embed", None)
    assert params["patch_embedding.kernel"].out_sharding[-1] == "embed"


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
    reloaded = SanaVideoTransformer3DModel(**case["config"]).to(torch_dtype)
    reloaded.load_state_dict(S.torch_state(back, dtype), strict=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_round_trip_bit_identical(tmp_path, capsys, dtype):
    torch_model = copy.deepcopy(_case("tiny")["torch_model"])  # the cache stays fp32
    src = tmp_path / "src"
    torch_model.to(getattr(torch, dtype)).save_pretrained(src)
    assert converters_main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
    stored = {np.dtype(d).name for _, d in jax_state.state_meta(str(tmp_path / "jax")).values()}
    assert stored == {dtype}
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert S.raw_safetensors(src) == S.raw_safetensors(tmp_path / "back")
    config = json.load(open(tmp_path / "back" / "config.json"))
    assert config["_class_name"] == "SanaVideoTransformer3DModel"
    SanaVideoTransformer3DModel.from_pretrained(str(tmp_path / "back"))
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "diffusion_pytorch_model.safetensors"))
    del tensors["transformer_blocks.1.ff.conv_temp.weight"]
    save_file(tensors, str(src / "diffusion_pytorch_model.safetensors"))
    capsys.readouterr()
    assert converters_main(["to-jax", str(src), str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "transformer_blocks.1.ff.conv_temp.weight" in err
    assert not (tmp_path / "bad").exists()


def test_load_transformer_from_a_pipeline_dir(tmp_path):
    """`load_transformer` of a pipeline dir serves its transformer/ and takes diffusers' keyword
    arguments."""
    from wfm_jax.models import load_transformer
    case = _case("p222_all_options")
    case["torch_model"].save_pretrained(tmp_path / "transformer")
    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "SanaVideoPipeline",
         "transformer": ["diffusers", "SanaVideoTransformer3DModel"]}))
    model = load_transformer(str(tmp_path))
    assert isinstance(model, SanaVideoTransformer)
    got = S.jit_forward(model)(**case["inputs"])
    assert float(np.max(np.abs(got - case["want"]))) <= S.ATOL


def test_bad_checkpoints_name_the_key():
    case = _case("tiny")
    config, tensors = case["config"], case["tensors"]
    table = build_table(config)
    shapes = flat_shapes(nnx.eval_shape(lambda: SanaVideoTransformer(config, rngs=nnx.Rngs(0))))
    key = "transformer_blocks.0.ff.conv_temp.weight"
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, S.loaders({k: v for k, v in tensors.items() if k != key}), shapes)
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, S.loaders({**tensors, key: np.zeros((24, 24, 1, 3), np.float32)}),
                       shapes)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_remat_checkpoints_each_block_with_its_policy(remat):
    model = nnx.eval_shape(lambda: SanaVideoTransformer(BASE, rngs=nnx.Rngs(0), remat=remat))
    graph, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, _inputs(BASE)).jaxpr
    checkpoints = [e for e in S.eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    if remat == "none":
        assert not checkpoints
    else:
        assert len(checkpoints) == BASE["num_layers"]
        assert all(e.params["policy"] is REMAT_POLICIES[remat] for e in checkpoints)


@pytest.mark.slow  # ~20 s; the sharded-gradient test below covers remat on 8 devices too
def test_remat_matches_no_remat_values_and_grads():
    case = _case("tiny")
    inputs = case["inputs"]

    def value_and_grad(remat):
        graph, state = nnx.split(_model(case, remat=remat))
        loss = lambda s: jnp.sum(nnx.merge(graph, s)(**inputs) ** 2)
        return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0), (v1, g1) = value_and_grad("none"), value_and_grad("dots")
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)


def test_released_config_matches_diffusers_shapes():
    """SANA-Video 2B 480p as data: diffusers' parameter shapes (meta tensors) and the released
    count (spec §0: 2.057B). Built with one block."""
    one = {**SANA_VIDEO_2B, "num_layers": 1}
    with torch.device("meta"):
        ref = {k: tuple(v.shape)
               for k, v in SanaVideoTransformer3DModel(**one).state_dict().items()}
    model = nnx.eval_shape(lambda: SanaVideoTransformer(one, rngs=nnx.Rngs(0)))
    check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
    sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
    block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
    total = sum(sizes.values()) + (SANA_VIDEO_2B["num_layers"] - 1) * block
    assert abs(total / 1e9 - 2.057) < 0.001, total


def test_bad_inputs_fail_clearly():
    model = nnx.eval_shape(lambda: SanaVideoTransformer(BASE, rngs=nnx.Rngs(0)))
    graph, state = nnx.split(model)
    run = lambda **kw: jax.eval_shape(lambda s: nnx.merge(graph, s)(**{**_inputs(BASE), **kw}),
                                      state)
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        run(hidden_states=np.zeros((2, 4, 3, 7, 6), np.float32))
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        run(hidden_states=np.zeros((2, 4, 40, 2, 2), np.float32))
    g = nnx.eval_shape(lambda: SanaVideoTransformer({**BASE, "guidance_embeds": True},
                                                    rngs=nnx.Rngs(0)))
    graph_g, state_g = nnx.split(g)
    with pytest.raises(ValueError, match="pass guidance"):
        jax.eval_shape(lambda s: nnx.merge(graph_g, s)(**_inputs(BASE)), state_g)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_forward_matches_diffusers():
    """Weights on their logical shards, batch over data, tokens over context: the RoPE'd linear
    attention's sums, the depthwise and temporal convs across the split must not move numbers."""
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


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
@pytest.mark.parametrize("rope", [False, True])
def test_context_parallel_linear_attention_equals_unsplit(rope):
    """Tokens split over context (and batch over data x fsdp): one psum of the state and key sum
    gives the unsplit result; the model takes this path under such a mesh (jaxpr: a shard_map
    whose psums carry the local (B/4, H, d, d) state and (B/4, H, d) key sum, nothing else), and
    keeps the plain one without a mesh."""
    from wfm_jax.core.mesh import make_mesh
    from wfm_jax.models.sana.linear_attention import (context_parallel_linear_attention,
                                                      sequence_split)
    rng = np.random.default_rng(4)
    grid, d = (2, 3, 4), 12
    q, k, v = (rng.standard_normal((4, 24, 2, d)).astype(np.float32) for _ in range(3))
    q, k = np.maximum(q, 0), np.maximum(k, 0)
    tables = tuple(jnp.asarray(t) for t in rope_tables(d, grid, 32)) if rope else None
    want = np.asarray(linear_attention(q, k, v, tables))
    mesh = make_mesh(data=2, fsdp=2, context=2)
    with jax.set_mesh(mesh):
        assert sequence_split(24, 4, 2) == ("context",)
        assert sequence_split(23, 4, 2) is None  # uneven: GSPMD's plain einsums instead
        fn = jax.jit(lambda *a: context_parallel_linear_attention(*a, seq_axes=("context",)))
        got = np.asarray(fn(q, k, v, tables))
        loss = lambda f: lambda *a: jnp.sum(f(*a, tables) ** 2)
        split = jax.jit(jax.grad(loss(lambda *a: context_parallel_linear_attention(
            *a, seq_axes=("context",))), argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    whole = jax.grad(loss(linear_attention), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(split, whole):  # and the same gradients (training under context parallel)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert sequence_split(24, 4, 2) is None  # no mesh
    case = _case("tiny")
    graph, state = nnx.split(_model(case))
    inputs = {k_: np.concatenate([v_, v_]) if np.ndim(v_) else v_
              for k_, v_ in case["inputs"].items()}
    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, inputs).jaxpr
    maps = [e for e in S.eqns(jaxpr) if e.primitive.name == "shard_map"]
    assert len(maps) == 2 * BASE["num_layers"]  # per block: the attention's, the temporal conv's
    psums = [e for e in S.eqns(jaxpr) if e.primitive.name in ("psum", "psum_invariant")]
    assert sorted(tuple(v_.aval.shape) for e in psums for v_ in e.outvars) == sorted(
        [(1, 2, 12, 12), (1, 2, 12)] * BASE["num_layers"])


@pytest.mark.slow  # two backward compiles, 17-27 s on the shared 2-core box
@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_remat_gradients_match_unsharded():
    """A training step's gradients under (data=2, fsdp=2, context=2) with remat equal the plain
    ones. (This caught XLA mis-partitioning a grouped conv's kernel gradient: the depthwise conv
    is written as shifted products for that reason.)"""
    from wfm_jax.core.mesh import make_mesh, param_shardings
    case = _case("tiny")
    inputs = {k: np.concatenate([v, v]) if np.ndim(v) else v for k, v in case["inputs"].items()}

    def value_and_grad(remat, mesh):
        model = _model(case, remat=remat)
        graph, state = nnx.split(model)
        loss = lambda s: jnp.sum(nnx.merge(graph, s)(**inputs) ** 2)
        if mesh is None:
            return jax.jit(jax.value_and_grad(loss))(state)
        shardings = param_shardings(model, mesh)
        for path, var in nnx.to_flat_state(state):
            var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
        with jax.set_mesh(mesh):
            return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0) = value_and_grad("none", None)
    (v1, g1) = value_and_grad("full", make_mesh(data=2, fsdp=2, context=2))
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    flat0, flat1 = dict(nnx.to_flat_state(g0)), dict(nnx.to_flat_state(g1))
    for key, b in flat0.items():
        a, b = np.asarray(flat1[key].get_value()), np.asarray(b.get_value())
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()) + 1e-7,
                                   err_msg=".".join(map(str, key)))
