"""policy.remat and policy.scan_layers (models/layers/remat.py) in every family's transformer:
values and parameter gradients equal with the blocks scanned or unrolled and under each remat
policy (tiny random models, fp32), and the parameter layout is the same either way."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conformance.model import checkpoints, norm_checkpoints
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.cosmos.transformer import CosmosTransformer
from wfm_jax.models.layers.remat import REMAT_POLICIES, block_groups, check_remat, resolve_remat
from wfm_jax.models.sana.transformer import SanaTransformer
from wfm_jax.models.sana.video import SanaVideoTransformer
from wfm_jax.models.sd3.transformer import SD3Transformer
from wfm_jax.models.wan.transformer import WanTransformer

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
T = np.array([999, 517], np.int64)
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.int64)

# family -> (class, tiny config with 3 identical blocks, forward kwargs)
FAMILIES = {
    "sd3": (SD3Transformer,
            dict(sample_size=8, patch_size=2, in_channels=4, num_layers=4, attention_head_dim=8,
                 num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                 pooled_projection_dim=8, out_channels=4, pos_embed_max_size=8),
            dict(hidden_states=f32(2, 4, 4, 6), encoder_hidden_states=f32(2, 3, 16),
                 pooled_projections=f32(2, 8), timestep=np.array([37.25, 812.9], np.float32))),
    "wan": (WanTransformer,
            dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                 in_channels=4, out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32,
                 num_layers=3, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                 rope_max_seq_len=32),
            dict(hidden_states=f32(2, 4, 2, 4, 6), timestep=T,
                 encoder_hidden_states=f32(2, 4, 16))),
    "cosmos": (CosmosTransformer,
               dict(in_channels=5, out_channels=4, num_attention_heads=2, attention_head_dim=12,
                    num_layers=3, mlp_ratio=2.0, text_embed_dim=16, adaln_lora_dim=8,
                    max_size=(8, 32, 32), patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0),
                    concat_padding_mask=True, extra_pos_embed_type=None),
               dict(hidden_states=f32(2, 4, 2, 4, 6), timestep=np.array([0.9, 0.25], np.float32),
                    encoder_hidden_states=f32(2, 4, 16),
                    condition_mask=np.zeros((2, 1, 2, 4, 6), np.float32),
                    padding_mask=np.zeros((1, 1, 4, 6), np.float32))),
    "sana": (SanaTransformer,
             dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                  num_layers=3, num_cross_attention_heads=2, cross_attention_head_dim=8,
                  cross_attention_dim=16, caption_channels=16, mlp_ratio=2.5, sample_size=8,
                  patch_size=1, qk_norm="rms_norm_across_heads", timestep_scale=1.0),
             dict(hidden_states=f32(2, 4, 4, 6), encoder_hidden_states=f32(2, 4, 16),
                  timestep=T, encoder_attention_mask=MASK)),
    "sana_video": (SanaVideoTransformer,
                   dict(in_channels=4, out_channels=4, num_attention_heads=2,
                        attention_head_dim=12, num_layers=3, num_cross_attention_heads=2,
                        cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=16,
                        mlp_ratio=3.0, sample_size=4, patch_size=(1, 2, 2),
                        qk_norm="rms_norm_across_heads", rope_max_seq_len=32),
                   dict(hidden_states=f32(2, 4, 2, 4, 6), encoder_hidden_states=f32(2, 4, 16),
                        timestep=T, encoder_attention_mask=MASK)),
}


def _model(family, **options):
    cls, config, _ = FAMILIES[family]
    return cls(config, rngs=nnx.Rngs(0), **options)


@functools.cache  # shared between the tests: the same (family, scan, policy) compiles once
def _value_and_grads(family, scan_layers, remat, norm_checkpoints=True):
    model = _model(family, scan_layers=scan_layers, remat=remat, norm_checkpoints=norm_checkpoints)
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    kwargs = FAMILIES[family][2]

    def loss(p):
        out = nnx.merge(graph, p, rest)(**kwargs)
        return jnp.mean(out.astype(jnp.float32) ** 2), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(out), {k: np.asarray(v) for k, v in nnx.to_flat_state(grads)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scanned_and_rematerialised_blocks_equal_the_plain_loop(family):
    want_out, want_grads = _value_and_grads(family, False, "everything_saveable")
    # scan + a policy against the plain loop (each compile is seconds on a shared 2-core box)
    for scan_layers, remat in ((True, "nothing_saveable"),) if family != "wan" else (
            (True, "everything_saveable"), (True, "nothing_saveable"),
            (False, "dots_with_no_batch_dims_saveable")):
        out, grads = _value_and_grads(family, scan_layers, remat)
        np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=0,
                                   err_msg=f"scan={scan_layers} remat={remat}")
        assert grads.keys() == want_grads.keys()
        for k, g in grads.items():
            np.testing.assert_allclose(g, want_grads[k], atol=2e-5, rtol=1e-5,
                                       err_msg=f"{k}: scan={scan_layers} remat={remat}")


def test_every_named_policy_gives_the_same_gradients():
    want_out, want_grads = _value_and_grads("wan", True, "everything_saveable")
    # offloading runs as dots_with_no_batch_dims_saveable on CPU
    for remat in ("dots_saveable", "offload_dot_with_no_batch_dims"):
        out, grads = _value_and_grads("wan", True, remat)
        np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=0)
        for k, g in grads.items():
            np.testing.assert_allclose(g, want_grads[k], atol=2e-5, rtol=1e-5, err_msg=str(k))


def _norm_checkpoints(family, **options) -> int:
    """How many of the norms' own checkpoints (layers/norms.py) the forward traces."""
    graph, state = nnx.split(abstract_module(lambda: _model(family, **options)))
    jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, FAMILIES[family][2])
    return len(norm_checkpoints(jaxpr.jaxpr))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_norm_checkpoints_off_traces_none_and_changes_no_number(family):
    """policy.norm_checkpoints=False (ModelOptions): the forward traces none of the norms' own
    checkpoints (it does with the default, scanned or not); per-block remat is untouched; the
    values and gradients are the plain loop's (two families compiled: the checkpoints switch
    in SD3's forward and in the SANA base's shared body)."""
    assert _norm_checkpoints(family, scan_layers=False) > 0
    assert _norm_checkpoints(family, scan_layers=True, remat="dots") > 0
    assert _norm_checkpoints(family, scan_layers=False, norm_checkpoints=False) == 0
    assert _norm_checkpoints(family, scan_layers=True, remat="dots", norm_checkpoints=False) == 0
    if family not in ("sd3", "sana_video"):
        return
    want_out, want_grads = _value_and_grads(family, False, "everything_saveable")
    out, grads = _value_and_grads(family, False, "everything_saveable", False)
    np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=0)
    assert grads.keys() == want_grads.keys()
    for k, g in grads.items():
        np.testing.assert_allclose(g, want_grads[k], atol=2e-5, rtol=1e-5, err_msg=str(k))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_scan_keeps_the_parameter_layout(family):
    scanned = abstract_module(lambda: _model(family, scan_layers=True))
    unrolled = abstract_module(lambda: _model(family, scan_layers=False))
    shapes = lambda m: {k: v.shape for k, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}
    assert shapes(scanned) == shapes(unrolled)


@pytest.mark.parametrize("family", ["wan", "cosmos", "sana", "sana_video"])
def test_identical_blocks_run_as_one_scan_with_the_policy_inside(family):
    model = abstract_module(lambda: _model(family, scan_layers=True, remat="dots"))
    blocks = model.blocks if family == "wan" else model.transformer_blocks
    assert block_groups(blocks, True) == [[0, 1, 2]]
    graph, state = nnx.split(model)
    kwargs = FAMILIES[family][2]
    jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, kwargs).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 3
    found = checkpoints(jaxpr)  # the per-block ones, not the norms' own
    assert len(found) == 1 and found[0].params["policy"] is (
        REMAT_POLICIES["dots_with_no_batch_dims_saveable"])


def test_policies_carry_jax_names_and_the_short_names_map_onto_them():
    assert {check_remat(n) for n in REMAT_POLICIES} == set(REMAT_POLICIES)
    own = {"offload_dot_with_no_batch_dims", "attention_saveable",  # composed, not JAX's own
           "dots_with_no_batch_dims_and_attention_saveable"}
    for name in REMAT_POLICIES:  # a policy's name is its jax.checkpoint_policies name
        if REMAT_POLICIES[name] is not None and name not in own:
            assert REMAT_POLICIES[name] is getattr(jax.checkpoint_policies, name)
    assert REMAT_POLICIES["everything_saveable"] is None  # kept everything: no checkpoint at all
    assert {a: check_remat(a) for a in ("none", "full", "dots", "dots_no_batch", "offload")} == {
        "none": "everything_saveable", "full": "nothing_saveable",
        "dots": "dots_with_no_batch_dims_saveable", "dots_no_batch": "dots_saveable",
        "offload": "offload_dot_with_no_batch_dims"}
    model = abstract_module(lambda: _model("wan", scan_layers=True, remat="full"))
    assert model.remat == "nothing_saveable"  # the model stores the JAX name


def test_offload_on_cpu_falls_back_to_dots_with_one_warning():
    with pytest.warns(UserWarning, match="no pinned host memory") as record:
        assert resolve_remat("offload_dot_with_no_batch_dims") == "dots_with_no_batch_dims_saveable"
    assert len(record) == 1
    with pytest.raises(ValueError, match="remat must be one of"):
        WanTransformer(FAMILIES["wan"][1], rngs=nnx.Rngs(0), remat="selective")
