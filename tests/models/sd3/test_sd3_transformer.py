"""SD3 MMDiT: forward parity with diffusers, and the two-way converter table.

Tiny random diffusers models (every weight re-drawn, so zero-initialised modulation and output
layers do not hide mistakes) go through the converter table into the wfm_jax model; the forward
must match torch in fp32 to 2e-5. The latent grid is non-square and smaller than
pos_embed_max_size, so the centre crop of the position table is exercised.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from diffusers import SD3Transformer2DModel
from flax import nnx

from converters.sd3_transformer import build_table, make_model
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.models.sd3 import REMAT_POLICIES, SD3Transformer
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes

BASE = dict(sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
            pooled_projection_dim=8, out_channels=4, pos_embed_max_size=24)
VARIANTS = {
    "plain": {},
    "qk_rms": dict(qk_norm="rms_norm"),
    "dual": dict(dual_attention_layers=(0,), qk_norm="rms_norm"),
    # SD3.5-M layout in small: scanned runs of dual and plain blocks, then the last block
    "dual_scanned": dict(num_layers=6, dual_attention_layers=(0, 1, 2), qk_norm="rms_norm"),
}
BATCH, HEIGHT, WIDTH, TEXT_LEN = 2, 8, 12, 5  # 4x6 patches, cropped from the 24x24 table
TIMESTEPS = np.array([37.25, 812.9], np.float32)  # non-integer, far apart
ATOL = 2e-5
# bf16 compute (fp32 master weights) vs fp32, relative to the output's max magnitude: bf16 keeps
# 8 significant bits (relative step 2^-8 ~ 4e-3 per rounding); ~10 chained matmul/attention
# roundings in this tiny model measure ~0.6%, so 2% leaves room yet catches a wrong cast.
BF16_REL_TOL = 2e-2


def _torch_model(variant: str) -> tuple[dict, SD3Transformer2DModel]:
    config = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    model = SD3Transformer2DModel(**config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # diffusers zero-inits adaLN / out layers: redraw all
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        # pos_embed is a buffer: perturb it too, so the test sees the checkpoint's table is used
        model.pos_embed.pos_embed.add_(torch.randn(model.pos_embed.pos_embed.shape, generator=gen)
                                       * 0.01)
    return config, model


def _loaders(tensors: dict[str, np.ndarray]):
    return {k: (lambda v=v: v) for k, v in tensors.items()}


def _numpy_state(model: torch.nn.Module, dtype=torch.float32) -> dict[str, np.ndarray]:
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(dtype).contiguous()
        if dtype == torch.bfloat16:
            out[k] = v.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            out[k] = v.numpy()
    return out


def _jax_model(config, tensors, *, dtype=None, param_dtype=jnp.float32, **options):
    """Abstract model (no random init: that costs one compile per shape) filled from the table."""
    model = nnx.eval_shape(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0), **options))
    flat = convert_to_jax(build_table(config), _loaders(tensors), flat_shapes(model))
    params = flat_params(model)
    assert set(params) == set(flat)
    for key, var in params.items():
        var.set_value(jnp.asarray(flat[key], param_dtype))
    return model


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, 4, HEIGHT, WIDTH), np.float32),
            rng.standard_normal((BATCH, TEXT_LEN, BASE["joint_attention_dim"]), np.float32),
            rng.standard_normal((BATCH, BASE["pooled_projection_dim"]), np.float32),
            TIMESTEPS)


def _jit_forward(model):
    graph, state = nnx.split(model)
    fn = jax.jit(lambda s, *a: nnx.merge(graph, s)(*a))
    return lambda *a: np.asarray(fn(state, *a))


@functools.lru_cache(maxsize=None)
def _case(variant: str) -> dict:
    """Torch model, its fp32 tensors and its output on the shared inputs (built once per variant)."""
    config, torch_model = _torch_model(variant)
    inputs = _inputs()
    with torch.no_grad():
        want = torch_model(*(torch.from_numpy(x) for x in inputs), return_dict=False)[0].numpy()
    return dict(variant=variant, config=config, torch_model=torch_model,
                tensors=_numpy_state(torch_model), inputs=inputs, want=want)


@pytest.fixture(params=list(VARIANTS))
def case(request):
    return _case(request.param)


def test_forward_matches_diffusers_fp32(case):
    model = _jax_model(case["config"], case["tensors"])
    got = _jit_forward(model)(*case["inputs"])
    assert got.shape == case["want"].shape
    err = np.max(np.abs(got - case["want"]))
    assert err <= ATOL, f"{case['variant']}: max abs diff {err:.3g}"


def test_bf16_compute_close_to_fp32():
    case = _case("dual")  # the richest variant is enough for a smoke check
    model = _jax_model(case["config"], case["tensors"], dtype=jnp.bfloat16)
    got = _jit_forward(model)(*case["inputs"])
    assert got.dtype == jnp.bfloat16
    got = got.astype(np.float32)
    assert np.all(np.isfinite(got))
    want = case["want"]
    rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert rel <= BF16_REL_TOL, f"bf16 vs fp32 relative error {rel:.3g}"


@pytest.mark.parametrize("extra", [{}, VARIANTS["qk_rms"], VARIANTS["dual"],
                                   dict(pos_embed_max_size=None),  # no position buffer stored
                                   dict(qk_norm="layer_norm", dual_attention_layers=(0, 1))],
                         ids=["plain", "qk_rms", "dual", "no_pos_buffer", "qk_layer_norm"])
def test_table_maps_every_key_exactly_once(extra):
    config = {**BASE, **extra}
    hf_keys = set(SD3Transformer2DModel(**config).state_dict())
    table = build_table(config)
    assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
    assert {r.hf for r in table} == hf_keys
    model = nnx.eval_shape(lambda: SD3Transformer(config, rngs=nnx.Rngs(0)))
    assert {r.jax for r in table} == set(flat_shapes(model))


def test_every_parameter_has_logical_axes():
    model = nnx.eval_shape(lambda: SD3Transformer({**BASE, **VARIANTS["dual"]}, rngs=nnx.Rngs(0)))
    params = flat_params(model)
    for key, var in params.items():
        axes = getattr(var, "out_sharding", None)
        assert axes is not None and len(axes) == len(var.shape), key
    block = "transformer_blocks.0"
    assert params[f"{block}.attn.to_q.kernel"].out_sharding == ("embed", "heads")
    assert params[f"{block}.attn2.to_out.0.kernel"].out_sharding == ("heads", "embed")
    assert params[f"{block}.ff.net.0.proj.kernel"].out_sharding == ("embed", "mlp")
    assert params[f"{block}.ff_context.net.2.kernel"].out_sharding == ("mlp", "embed")
    assert isinstance(params["pos_embed.pos_embed"], Buffer)  # loaded and saved, never trained


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_identical_and_loads_in_diffusers(case, dtype):
    torch_dtype = getattr(torch, dtype)
    param_dtype = jnp.dtype(dtype)
    tensors = _numpy_state(case["torch_model"], torch_dtype)
    model = _jax_model(case["config"], tensors, param_dtype=param_dtype)
    back = convert_to_diffusers(build_table(case["config"]), flat_arrays(model))
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), f"{key} changed in the round trip"
    reloaded = SD3Transformer2DModel(**case["config"]).to(torch_dtype)
    state = {k: (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16) if dtype == "bfloat16"
                 else torch.from_numpy(v.copy())) for k, v in back.items()}
    reloaded.load_state_dict(state, strict=True)


def test_bad_checkpoints_name_the_key():
    case = _case("plain")
    config, tensors = case["config"], case["tensors"]
    table = build_table(config)
    shapes = flat_shapes(nnx.eval_shape(lambda: SD3Transformer(config, rngs=nnx.Rngs(0))))
    key = "transformer_blocks.0.attn.to_q.weight"

    missing = {k: v for k, v in tensors.items() if k != key}
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders(missing), shapes)

    extra = {**tensors, "transformer_blocks.0.attn.bogus.weight": tensors[key]}
    with pytest.raises(ConversionError, match="transformer_blocks.0.attn.bogus.weight"):
        convert_to_jax(table, _loaders(extra), shapes)

    wrong = {**tensors, key: np.zeros((3, 16), np.float32)}
    with pytest.raises(ConversionError, match=key):
        convert_to_jax(table, _loaders(wrong), shapes)

    # a checkpoint of another config (qk norm) has keys this table does not know
    qk_tensors = _numpy_state(_torch_model("qk_rms")[1])
    with pytest.raises(ConversionError, match="norm_q"):
        convert_to_jax(table, _loaders(qk_tensors), shapes)


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
    # blocks 0-2 are alike (one scan), block 3 is the context_pre_only last one
    config = {**BASE, "num_layers": 4}
    model = nnx.eval_shape(lambda: SD3Transformer(config, rngs=nnx.Rngs(0), remat=remat))
    assert model.block_groups() == [[0, 1, 2], [3]]
    graph, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, *a: nnx.merge(graph, s)(*a))(state, *_inputs()).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 3
    checkpoints = [e for e in _eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    in_scan = [e for e in _eqns(scans[0].params["jaxpr"].jaxpr)
               if e.primitive.name in ("checkpoint", "remat2")]
    if remat == "none":
        assert not checkpoints
    else:  # the policy sits inside the scanned body, once, and on the last block
        assert len(checkpoints) == 2 and len(in_scan) == 1
        assert all(e.params["policy"] is REMAT_POLICIES[remat] for e in checkpoints)


def test_sd35_medium_groups_and_scan_matches_unrolled():
    sd35m = dict(num_layers=24, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
    model = nnx.eval_shape(lambda: SD3Transformer({**BASE, **sd35m}, rngs=nnx.Rngs(0)))
    assert model.block_groups() == [list(range(13)), list(range(13, 23)), [23]]
    config = {**BASE, "num_layers": 5, "dual_attention_layers": (0, 1), "qk_norm": "rms_norm"}
    outs = []
    for scan in (True, False):
        model = SD3Transformer(config, rngs=nnx.Rngs(0), scan_layers=scan)
        assert len(model.block_groups()) == (3 if scan else 5)
        outs.append(np.asarray(model(*_inputs())))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)


def test_remat_runs_inside_a_scan_and_matches_no_remat():
    """The RL rollout merges the model inside a lax.scan under jit; nnx.remat failed there
    ("Cannot mutate Param from a different trace level"). Values and gradients equal remat none."""
    latents, text, pooled, t = _inputs()

    def loss_and_grad(remat):
        model = SD3Transformer(BASE, rngs=nnx.Rngs(0), remat=remat)
        graph, state = nnx.split(model)

        def loss(s):
            def body(x, _):
                return nnx.merge(graph, s)(x, text, pooled, t), None
            return jnp.sum(jax.lax.scan(body, latents, None, length=2)[0] ** 2)

        return jax.jit(jax.value_and_grad(loss))(state)

    (v0, g0), (v1, g1) = loss_and_grad("none"), loss_and_grad("full")
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):  # recompute order: fp32 rounding
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)


def test_bad_options_and_inputs_fail_clearly():
    with pytest.raises(ValueError, match="cudnn"):
        nnx.eval_shape(lambda: SD3Transformer(BASE, rngs=nnx.Rngs(0), attention_impl="cudnn"))
    with pytest.raises(ValueError, match="remat"):
        nnx.eval_shape(lambda: SD3Transformer(BASE, rngs=nnx.Rngs(0), remat="some"))
    with pytest.warns(UserWarning, match="pos_embed_max"):  # diffusers also ignores unknown keys
        nnx.eval_shape(lambda: SD3Transformer({**BASE, "pos_embed_max": 4}, rngs=nnx.Rngs(0)))
    model = nnx.eval_shape(lambda: SD3Transformer(BASE, rngs=nnx.Rngs(0)))
    graph, state = nnx.split(model)
    latents, text, pooled, t = _inputs()
    too_big = np.zeros((1, 4, 2 * 25, 8), np.float32)  # 25 patches > pos_embed_max_size 24
    with pytest.raises(ValueError, match="pos_embed_max_size"):
        jax.eval_shape(lambda s: nnx.merge(graph, s)(too_big, text[:1], pooled[:1], t[:1]), state)


def test_lora_trains_through_the_scanned_blocks():
    """LoRA adapters in scanned blocks: the same loss and adapter gradients as unrolled, and
    every block's adapters get their own gradient."""
    from wfm_jax.models.lora import attach_lora
    config = {**BASE, "num_layers": 4}
    latents, text, pooled, t = _inputs()
    results = []
    for scan in (True, False):
        model = SD3Transformer(config, rngs=nnx.Rngs(0), scan_layers=scan)
        attach_lora(model, ["attn.to_q", "ff.net.2"], 4, 8, seed=3)
        for _, var in nnx.state(model, nnx.LoRAParam).flat_state():  # B != 0: a real gradient
            var.set_value(var.get_value() + 0.01)
        graph, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
        loss = lambda p: jnp.sum(nnx.merge(graph, p, rest)(latents, text, pooled, t) ** 2)
        results.append(jax.jit(jax.value_and_grad(loss))(lora))
    (v_scan, g_scan), (v_loop, g_loop) = results
    np.testing.assert_allclose(v_scan, v_loop, rtol=1e-6)
    flat = dict(g_scan.flat_state())
    assert ("transformer_blocks", 2, "attn", "to_q", "lora_b") in flat
    for (path, a), (_, b) in zip(g_scan.flat_state(), g_loop.flat_state()):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        assert np.abs(a).max() > 0, path
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max())
