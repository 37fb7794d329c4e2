"""Cosmos-Predict2.5 DiT (CosmosTransformer3DModel): forward parity with diffusers, the converter
table both ways (in memory and through `python -m converters`), remat, sharding and the released
configs.

Tiny random diffusers models with every weight re-drawn (norm weights too, so a swapped mapping
shows) go through the converter into the wfm_jax model; the forward must match torch in fp32 to
2e-5. Variants (the tiny config of spec video_models.md §4.1, batch 2, non-square grid):
  proj:       crossattn_proj on, one sigma per sample, a nonzero condition mask, zero padding mask
  frames:     no crossattn_proj, per-frame sigmas [B, 1, T, 1, 1] (first frame conditioned at
              1e-4), a random padding mask resized from an odd size, fps set
  p222:       patch (2, 2, 2) (temporal patching and the odd unpatchify order), out_channels 3,
              rope_scale (2, 1, 1), one sigma shared by the batch ([1])
diffusers' padding-mask resize needs torchvision, which is not installed: its tensor
resize(NEAREST) is F.interpolate(mode="nearest"), shimmed exactly as spec §4.1 says.
"""
from __future__ import annotations

import copy
import functools
import json
import os
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import CosmosTransformer3DModel
from diffusers.models.transformers import transformer_cosmos
from flax import nnx
from safetensors import safe_open

from converters import jax_state
from converters.cli import main as converters_main
from converters.cosmos_transformer import build_table, make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.models.cosmos import COSMOS25_PREDICT_2B, COSMOS25_PREDICT_14B, CosmosTransformer
from wfm_jax.models.cosmos.embeddings import resize_nearest
from wfm_jax.models.cosmos.rope import rope_tables
from wfm_jax.models.layers.remat import REMAT_POLICIES
from converters.loading import check_against_model
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes

transformer_cosmos.transforms = SimpleNamespace(
    functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                               F.interpolate(img, size=size, mode="nearest")),
    InterpolationMode=SimpleNamespace(NEAREST="nearest"))

BASE = dict(in_channels=4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=12,
            num_layers=2, mlp_ratio=2.0, text_embed_dim=16, adaln_lora_dim=8, max_size=(8, 32, 32),
            patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0), concat_padding_mask=True,
            extra_pos_embed_type=None, use_crossattn_projection=True,
            crossattn_proj_in_channels=32, encoder_hidden_states_channels=16)
VARIANTS = {
    "proj": {},
    "frames": dict(use_crossattn_projection=False),
    "p222": dict(patch_size=(2, 2, 2), out_channels=3, rope_scale=(2.0, 1.0, 1.0)),
}
SHAPE = (2, 4, 4, 8, 6)  # (B, C, T, H, W): grid (4|2, 4, 3), non-square
TEXT_LEN = 7
ATOL = 2e-5
BF16_REL_TOL = 2e-2  # as the SD3 / Wan tests


def _torch_model(variant: str):
    config = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    model = CosmosTransformer3DModel(**config).eval()
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


def _inputs(variant: str, config: dict):
    """(positional args, keyword args) as numpy, the diffusers forward's layout."""
    rng = np.random.default_rng(0)
    b, c, t, h, w = SHAPE
    x = rng.standard_normal((b, c, t, h, w), np.float32)
    text_dim = (config["crossattn_proj_in_channels"] if config["use_crossattn_projection"]
                else config["text_embed_dim"])
    text = rng.standard_normal((b, TEXT_LEN, text_dim), np.float32)
    cond = np.zeros((b, 1, t, h, w), np.float32)
    cond[:, :, :1] = 1.0  # the first latent frame is a conditioning frame
    kwargs = dict(condition_mask=cond, padding_mask=np.zeros((1, 1, 64, 64), np.float32))
    if variant == "frames":
        sigma = np.full((b, 1, t, 1, 1), 0.7, np.float32)
        sigma[:, :, 0] = 1e-4
        sigma[1] *= 0.5
        kwargs["padding_mask"] = (rng.random((1, 1, 13, 11)) > 0.5).astype(np.float32)
        kwargs["fps"] = 16
    elif variant == "p222":
        sigma = np.array([0.35], np.float32)
    else:
        sigma = np.array([0.9, 0.25], np.float32)
    return (x, sigma, text), kwargs


def _jit_forward(model):
    graph, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames=("fps",))
    def fn(s, x, t, text, condition_mask, padding_mask, fps=None):
        return nnx.merge(graph, s)(x, t, text, condition_mask=condition_mask,
                                   padding_mask=padding_mask, fps=fps)

    return lambda *a, **k: np.asarray(fn(state, *a, **k))


def _torch_args(args, kwargs):
    t = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a
    return [t(a) for a in args], {k: t(v) for k, v in kwargs.items()}


@functools.lru_cache(maxsize=None)
def _case(variant: str) -> dict:
    config, torch_model = _torch_model(variant)
    args, kwargs = _inputs(variant, config)
    targs, tkwargs = _torch_args(args, kwargs)
    with torch.no_grad():
        want = torch_model(*targs, **tkwargs, return_dict=False)[0].numpy()
    return dict(variant=variant, config=config, torch_model=torch_model,
                tensors=_numpy_state(torch_model), args=args, kwargs=kwargs, want=want)


@pytest.fixture(params=list(VARIANTS))
def case(request):
    return _case(request.param)


def test_forward_matches_diffusers_fp32(case):
    got = _jit_forward(_jax_model(case["config"], case["tensors"]))(*case["args"],
                                                                     **case["kwargs"])
    assert got.shape == case["want"].shape
    err = float(np.max(np.abs(got - case["want"])))
    print(f"cosmos transformer {case['variant']} fp32 max abs err {err:.3g}")
    assert err <= ATOL, f"{case['variant']}: max abs diff {err:.3g}"


def test_masks_and_per_frame_sigmas_reach_the_output():
    """The parity variants exercise every input: changing the condition mask, the padding mask
    or one frame's sigma changes diffusers' output (so a port ignoring one would fail)."""
    case = _case("frames")
    args, kwargs = case["args"], case["kwargs"]
    sigma = args[1].copy()
    sigma[:, :, 0] = 0.7
    changed = [((args[0], sigma, args[2]), kwargs),
               (args, {**kwargs, "condition_mask": np.zeros_like(kwargs["condition_mask"])}),
               (args, {**kwargs, "padding_mask": np.zeros_like(kwargs["padding_mask"])}),
               (args, {**kwargs, "fps": None})]
    for a, k in changed:
        ta, tk = _torch_args(a, k)
        with torch.no_grad():
            out = case["torch_model"](*ta, **tk, return_dict=False)[0].numpy()
        assert np.max(np.abs(out - case["want"])) > 1e-3


def test_bf16_compute_close_to_fp32_and_to_diffusers_bf16(tmp_path):
    """bf16 compute with fp32 master weights: within 2% of fp32, and no further from it than
    twice what diffusers' own bf16 model is."""
    case = _case("frames")
    model = _jax_model(case["config"], case["tensors"], dtype=jnp.bfloat16)
    got = _jit_forward(model)(*case["args"], **case["kwargs"])
    assert got.dtype == jnp.bfloat16
    got, want = got.astype(np.float32), case["want"]
    scale = np.max(np.abs(want))
    rel = np.max(np.abs(got - want)) / scale
    assert np.all(np.isfinite(got)) and rel <= BF16_REL_TOL, rel
    case["torch_model"].save_pretrained(tmp_path)
    ref = CosmosTransformer3DModel.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
    (x, t, text), kwargs = _torch_args(case["args"], case["kwargs"])
    kwargs = {k: (v.bfloat16() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    with torch.no_grad():
        theirs = ref(x.bfloat16(), t.bfloat16(), text.bfloat16(), **kwargs,
                     return_dict=False)[0].float().numpy()
    ref_rel = np.max(np.abs(theirs - want)) / scale
    print(f"cosmos bf16 rel err {rel:.3g} (diffusers bf16 {ref_rel:.3g})")
    assert rel <= 2 * ref_rel, (rel, ref_rel)


@pytest.mark.parametrize("head_dim, max_size, scale, grid, fps", [
    (128, (128, 240, 240), (1.0, 3.0, 3.0), (24, 30, 40), None),  # Predict2.5, 720p-ish grid
    (12, (8, 32, 32), (1.0, 3.0, 3.0), (3, 4, 4), None),
    (128, (128, 240, 240), (2.0, 1.0, 1.0), (7, 5, 6), 16),
])
def test_rope_tables_match_diffusers(head_dim, max_size, scale, grid, fps):
    """Within one float32 ulp: diffusers builds the tables with torch's float32 pow / cos / sin
    (not correctly rounded); ours round each step correctly. Both halves of diffusers' table are
    equal (the rotate-half layout), ours hold one."""
    from diffusers.models.transformers.transformer_cosmos import CosmosRotaryPosEmbed
    rope = CosmosRotaryPosEmbed(head_dim, max_size, (1, 2, 2), rope_scale=scale)
    cos_t, sin_t = rope(torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2]), fps=fps)
    positions = max(m // p for m, p in zip(max_size, (1, 2, 2)))
    cos, sin = rope_tables(head_dim, grid, positions, scale, fps)
    half = head_dim // 2
    for ours, theirs in ((cos, cos_t.numpy()), (sin, sin_t.numpy())):
        np.testing.assert_array_equal(theirs[:, :half], theirs[:, half:])
        np.testing.assert_allclose(ours, theirs[:, :half], rtol=0, atol=2 ** -23)
    with pytest.raises(ValueError, match="exceeds the RoPE table"):
        rope_tables(head_dim, (2, positions + 1, 3), positions, scale)


@pytest.mark.parametrize("size_in, size_out", [((64, 64), (8, 6)), ((13, 11), (8, 6)),
                                               ((3, 5), (8, 6)), ((8, 6), (8, 6)),
                                               ((7, 9), (14, 27))])
def test_padding_mask_resize_is_torch_nearest(size_in, size_out):
    x = np.random.default_rng(0).standard_normal((2, 1, *size_in)).astype(np.float32)
    want = F.interpolate(torch.from_numpy(x), size=list(size_out), mode="nearest").numpy()
    np.testing.assert_array_equal(np.asarray(resize_nearest(jnp.asarray(x), *size_out)), want)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_table_maps_every_key_exactly_once(variant):
    config = {**BASE, **VARIANTS[variant]}
    table = build_table(config)
    assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
    assert {r.hf for r in table} == set(CosmosTransformer3DModel(**config).state_dict())
    model = nnx.eval_shape(lambda: CosmosTransformer(config, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))


def test_every_parameter_has_logical_axes():
    params = flat_params(nnx.eval_shape(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0))))
    for key, var in params.items():
        axes = getattr(var, "out_sharding", None)
        assert axes is not None and len(axes) == len(var.shape), key
    assert params["transformer_blocks.0.attn1.to_q.kernel"].out_sharding == ("embed", "heads")
    assert params["transformer_blocks.1.attn2.to_out.0.kernel"].out_sharding == ("heads", "embed")
    assert params["transformer_blocks.0.ff.net.0.proj.kernel"].out_sharding == ("embed", "mlp")
    assert params["transformer_blocks.0.norm1.linear_2.kernel"].out_sharding == (None, "embed")
    assert params["crossattn_proj.0.kernel"].out_sharding == (None, "embed")


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
    reloaded = CosmosTransformer3DModel(**case["config"]).to(torch_dtype)
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
    torch_model = copy.deepcopy(_case("proj")["torch_model"])  # the cached one stays fp32
    src = tmp_path / "src"
    torch_model.to(getattr(torch, dtype)).save_pretrained(src)
    assert converters_main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
    stored = {np.dtype(d).name for _, d in jax_state.state_meta(str(tmp_path / "jax")).values()}
    assert stored == {dtype}
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert _raw(src) == _raw(tmp_path / "back")
    config = json.load(open(tmp_path / "back" / "config.json"))
    assert config["_class_name"] == "CosmosTransformer3DModel"
    CosmosTransformer3DModel.from_pretrained(str(tmp_path / "back"))  # diffusers loads it
    # a missing key is one line naming it, nothing written
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "diffusion_pytorch_model.safetensors"))
    del tensors["transformer_blocks.1.attn2.norm_k.weight"]
    save_file(tensors, str(src / "diffusion_pytorch_model.safetensors"))
    capsys.readouterr()
    assert converters_main(["to-jax", str(src), str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "transformer_blocks.1.attn2.norm_k.weight" in err
    assert not (tmp_path / "bad").exists()


def test_load_transformer_takes_diffusers_keywords(tmp_path):
    """wfm_jax.models.load_transformer on a diffusers dir and on the converted state dir gives
    the Cosmos model, called with the diffusers forward's keyword arguments."""
    from wfm_jax.models import load_transformer
    case = _case("proj")
    case["torch_model"].save_pretrained(tmp_path / "hf")
    assert converters_main(["to-jax", str(tmp_path / "hf"), str(tmp_path / "jax")]) == 0
    (x, t, text), kwargs = case["args"], case["kwargs"]
    for path in (tmp_path / "hf", tmp_path / "jax"):
        model = load_transformer(str(path))
        assert isinstance(model, CosmosTransformer)
        got = np.asarray(model(hidden_states=x, timestep=t, encoder_hidden_states=text,
                               condition_mask=kwargs["condition_mask"],
                               padding_mask=kwargs["padding_mask"]))
        assert float(np.max(np.abs(got - case["want"]))) <= ATOL


def test_bad_checkpoints_name_the_key():
    case = _case("proj")
    config, tensors = case["config"], case["tensors"]
    table = build_table(config)
    shapes = flat_shapes(nnx.eval_shape(lambda: CosmosTransformer(config, rngs=nnx.Rngs(0))))
    key = "transformer_blocks.0.attn1.to_q.weight"
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders({k: v for k, v in tensors.items() if k != key}), shapes)
    with pytest.raises(ConversionError, match="transformer_blocks.0.attn1.bogus"):
        convert_to_jax(table, _loaders({**tensors, "transformer_blocks.0.attn1.bogus":
                                        tensors[key]}), shapes)
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders({**tensors, key: np.zeros((3, 24), np.float32)}), shapes)
    # a checkpoint without crossattn_proj has keys this table lacks
    other = _case("frames")["tensors"]
    with pytest.raises(ConversionError, match="crossattn_proj"):
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
    model = nnx.eval_shape(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0), remat=remat))
    graph, state = nnx.split(model)
    args, kwargs = _inputs("proj", BASE)
    jaxpr = jax.make_jaxpr(lambda s, *a: nnx.merge(graph, s)(*a, **kwargs))(state, *args).jaxpr
    checkpoints = [e for e in _eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    if remat == "none":
        assert not checkpoints
    else:
        assert len(checkpoints) == BASE["num_layers"]
        assert all(e.params["policy"] is REMAT_POLICIES[remat] for e in checkpoints)


@pytest.mark.slow  # two backward compiles
def test_remat_matches_no_remat_values_and_grads():
    case = _case("frames")
    (x, t, text), kwargs = case["args"], case["kwargs"]

    def value_and_grad(remat):
        model = _jax_model(case["config"], case["tensors"], remat=remat)
        graph, state = nnx.split(model)
        loss = lambda s: jnp.sum(nnx.merge(graph, s)(x, t, text, **kwargs) ** 2)
        return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0), (v1, g1) = value_and_grad("none"), value_and_grad("full")
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)


@pytest.mark.parametrize("name, config", [("2B", COSMOS25_PREDICT_2B),
                                          ("14B", COSMOS25_PREDICT_14B)])
def test_released_configs_match_diffusers_shapes(name, config):
    """The configs as data: the same parameter shapes as diffusers builds (meta tensors), and the
    released parameter count. Built with one block (the blocks are identical) to stay fast."""
    one = {**config, "num_layers": 1}
    with torch.device("meta"):
        ref = {k: tuple(v.shape) for k, v in CosmosTransformer3DModel(**one).state_dict().items()}
    model = nnx.eval_shape(lambda: CosmosTransformer(one, rngs=nnx.Rngs(0)))
    check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
    sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
    assert sizes["patch_embed.proj.kernel"] == 72 * 128 * config["num_attention_heads"]
    block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
    total = sum(sizes.values()) + (config["num_layers"] - 1) * block
    assert abs(total / 1e9 - {"2B": 2.059, "14B": 14.37}[name]) < 0.01  # spec §0 [meas]


def test_bad_options_and_inputs_fail_clearly():
    def build(**overrides):
        return nnx.eval_shape(lambda: CosmosTransformer({**BASE, **overrides}, rngs=nnx.Rngs(0)))

    with pytest.raises(ValueError, match="extra_pos_embed_type='learnable'"):
        build(extra_pos_embed_type="learnable")
    with pytest.raises(ValueError, match="image context"):
        build(img_context_dim_in=16)
    with pytest.raises(ValueError, match="attention_head_dim"):
        build(attention_head_dim=8)  # diffusers: ZeroDivisionError
    with pytest.raises(ValueError, match="remat"):
        nnx.eval_shape(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0), remat="some"))
    with pytest.raises(ValueError, match="cudnn"):
        nnx.eval_shape(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0), attention_impl="cudnn"))
    graph, state = nnx.split(build())
    (x, t, text), kwargs = _inputs("proj", BASE)

    def run(x=x, t=t, text=text, **kw):
        kw = {**kwargs, **kw}
        return jax.eval_shape(lambda s: nnx.merge(graph, s)(x, t, text, **kw), state)

    assert run().shape == (2, 4, 4, 8, 6)
    with pytest.raises(ValueError, match="in_channels=5"):
        run(condition_mask=None)
    with pytest.raises(ValueError, match="condition_mask must have shape"):
        run(condition_mask=np.zeros((2, 1, 1, 8, 6), np.float32))
    with pytest.raises(ValueError, match=r"\[B, 1, T, 1, 1\]"):
        run(t=np.zeros((2, 1, 3, 1, 1), np.float32))
    with pytest.raises(ValueError, match="batch size 2"):
        run(t=np.zeros((3,), np.float32))
    with pytest.raises(ValueError, match="padding_mask"):
        run(padding_mask=np.zeros((3, 1, 8, 8), np.float32))
    with pytest.raises(ValueError, match="attention_mask"):
        run(attention_mask=np.ones((2, TEXT_LEN), bool))
    with pytest.raises(ValueError, match="fps must be None or a Python number"):
        run(fps=jnp.asarray(16.0))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        run(x=np.zeros((2, 4, 4, 7, 6), np.float32),
            condition_mask=np.zeros((2, 1, 4, 7, 6), np.float32))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
def test_sharded_forward_matches_diffusers():
    """Weights on their logical shards (embed over fsdp), batch over data, the token sequence
    over context: the numbers must not move. Per-frame sigmas (the pipeline's form) with a
    frame count (4) the context axis divides."""
    from wfm_jax.core.mesh import make_mesh, param_shardings
    case = _case("frames")
    model = _jax_model(case["config"], case["tensors"])
    mesh = make_mesh(data=2, fsdp=2, context=2)
    graph, state = nnx.split(model)
    shardings = param_shardings(model, mesh)
    for path, var in dict(nnx.to_flat_state(state)).items():
        key = ".".join(map(str, path))
        var.set_value(jax.device_put(var.get_value(), shardings[key]))
    placed = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}
    assert "fsdp" in str(placed["transformer_blocks.0.attn1.to_q.kernel"].sharding.spec)
    (x, t, text), kwargs = case["args"], case["kwargs"]
    with jax.set_mesh(mesh):
        fn = jax.jit(lambda s, *a: nnx.merge(graph, s)(*a, **kwargs))
        got = np.asarray(fn(state, x, t, text))
    err = float(np.max(np.abs(got - case["want"])))
    assert err <= ATOL, err


def test_lora_targets_address_diffusers_module_names():
    """cosmos-rl's Cosmos LoRA list (cosmos-predict2-5-2b-720-nft.toml; spec video_models.md
    §5.2) finds the same layers peft would: both attentions and the FFN of every block, not
    crossattn_proj."""
    from wfm_jax.models.lora import find_targets
    targets = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
    model = nnx.eval_shape(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0)))
    found = set(find_targets(model, targets))
    torch_model = CosmosTransformer3DModel(**BASE)
    peft_like = {name for name, m in torch_model.named_modules()
                 if isinstance(m, torch.nn.Linear)
                 and any(name == t or name.endswith("." + t) for t in targets)}
    assert found == peft_like
    assert len(found) == BASE["num_layers"] * (2 * 4 + 2)
    assert not any(p.startswith("crossattn_proj") for p in found)
