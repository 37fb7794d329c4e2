"""SD3 MMDiT (SD3Transformer2DModel): the model conformance checks on tiny random diffusers
models, plus what is SD3's own: the scan groups of SD3.5-M's dual/plain layout, the scanned remat
structure, the position-table crop and LoRA through scanned blocks.

Every weight is re-drawn (zero-initialised modulation and output layers would hide mistakes) and
the position buffer perturbed, so the test sees the checkpoint's table is used. The latent grid
(4x6 patches) is non-square and smaller than pos_embed_max_size, so the centre crop of the
position table is exercised.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import SD3Transformer2DModel
from flax import nnx

from converters.sd3_transformer import build_table, make_model
from tests.conformance import ModelConformance
from tests.conformance.model import checkpoints
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.models.layers.remat import check_remat, rematerialises
from wfm_jax.models.sd3 import REMAT_POLICIES, SD3Transformer

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
TABLE_CONFIGS = {"plain": {}, "qk_rms": VARIANTS["qk_rms"], "dual": VARIANTS["dual"],
                 "no_pos_buffer": dict(pos_embed_max_size=None),  # no position buffer stored
                 "qk_layer_norm": dict(qk_norm="layer_norm", dual_attention_layers=(0, 1))}
AXES = {"transformer_blocks.0.attn.to_q.kernel": ("embed", "heads"),
        "transformer_blocks.0.attn2.to_out.0.kernel": ("heads", "embed"),
        "transformer_blocks.0.ff.net.0.proj.kernel": ("embed", "mlp"),
        "transformer_blocks.0.ff_context.net.2.kernel": ("mlp", "embed")}
REMAT_CONFIG = dict(num_layers=4)
BATCH, HEIGHT, WIDTH, TEXT_LEN = 2, 8, 12, 5  # 4x6 patches, cropped from the 24x24 table
TIMESTEPS = np.array([37.25, 812.9], np.float32)  # non-integer, far apart


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((BATCH, 4, HEIGHT, WIDTH), np.float32),
            rng.standard_normal((BATCH, TEXT_LEN, BASE["joint_attention_dim"]), np.float32),
            rng.standard_normal((BATCH, BASE["pooled_projection_dim"]), np.float32),
            TIMESTEPS]


class TestSD3Transformer(ModelConformance):
    torch_class = SD3Transformer2DModel
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    base, variants = BASE, VARIANTS
    table_configs = TABLE_CONFIGS
    missing_key = "transformer_blocks.0.attn.to_q.weight"
    wrong_shape = (missing_key, (3, 16))
    unexpected_key = "transformer_blocks.0.attn.bogus.weight"
    other_variant, other_match = "qk_rms", "norm_q"  # a qk-norm checkpoint: keys we lack
    bf16_variant = "dual"  # the richest variant is enough
    axes_config = VARIANTS["dual"]
    expected_axes = AXES
    cli_variant, cli_missing_key = "dual", "transformer_blocks.1.attn.norm_k.weight"
    remat_config = REMAT_CONFIG  # blocks 0-2 alike (one scan), block 3 context_pre_only
    remat_variant, remat_scan_steps = "plain", 2
    scan_variant = "dual_scanned"
    sharded_param = "transformer_blocks.0.attn.to_q.kernel"

    def build_torch(self, config):
        torch.manual_seed(0)
        model = SD3Transformer2DModel(**config).eval()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():  # diffusers zero-inits adaLN / out layers: redraw all
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            if model.pos_embed.pos_embed is not None:  # a buffer: perturbed too
                model.pos_embed.pos_embed.add_(
                    torch.randn(model.pos_embed.pos_embed.shape, generator=gen) * 0.01)
        return model

    def inputs(self, variant, config):
        return _inputs(), {}

    def check_axes(self, params):
        assert isinstance(params["pos_embed.pos_embed"], Buffer)  # loaded and saved, never trained

    def check_remat_jaxpr(self, model, jaxpr, remat):
        assert model.block_groups() == [[0, 1, 2], [3]]
        scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
        assert len(scans) == 1 and scans[0].params["length"] == 3
        found, in_scan = checkpoints(jaxpr), checkpoints(scans[0].params["jaxpr"].jaxpr)
        if not rematerialises(remat):
            assert not found
        else:  # the policy sits inside the scanned body, once, and on the last block
            assert len(found) == 2 and len(in_scan) == 1
            assert all(e.params["policy"] is REMAT_POLICIES[check_remat(remat)] for e in found)

    def test_sd35_medium_groups_and_scan_matches_unrolled(self):
        sd35m = dict(num_layers=24, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
        model = abstract_module(lambda: SD3Transformer({**BASE, **sd35m}, rngs=nnx.Rngs(0)))
        assert model.block_groups() == [list(range(13)), list(range(13, 23)), [23]]
        config = {**BASE, "num_layers": 5, "dual_attention_layers": (0, 1), "qk_norm": "rms_norm"}
        outs = []
        for scan in (True, False):
            model = SD3Transformer(config, rngs=nnx.Rngs(0), scan_layers=scan)
            assert len(model.block_groups()) == (3 if scan else 5)
            # one jitted program per layout: run eagerly, every op compiled on its own
            outs.append(np.asarray(nnx.jit(lambda m, *a: m(*a))(model, *_inputs())))
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)

    def test_bad_inputs_fail_clearly(self):
        with pytest.warns(UserWarning, match="pos_embed_max"):  # diffusers ignores unknown keys too
            abstract_module(lambda: SD3Transformer({**BASE, "pos_embed_max": 4}, rngs=nnx.Rngs(0)))
        graph, state = nnx.split(abstract_module(lambda: SD3Transformer(BASE, rngs=nnx.Rngs(0))))
        _, text, pooled, t = _inputs()
        too_big = np.zeros((1, 4, 2 * 25, 8), np.float32)  # 25 patches > pos_embed_max_size 24
        with pytest.raises(ValueError, match="pos_embed_max_size"):
            jax.eval_shape(lambda s: nnx.merge(graph, s)(too_big, text[:1], pooled[:1], t[:1]),
                           state)

    def test_lora_trains_through_the_scanned_blocks(self):
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
            loss = lambda p, g=graph, r=rest: jnp.sum(nnx.merge(g, p, r)(latents, text, pooled, t) ** 2)
            results.append(jax.jit(jax.value_and_grad(loss))(lora))
        (v_scan, g_scan), (v_loop, g_loop) = results
        np.testing.assert_allclose(v_scan, v_loop, rtol=1e-6)
        flat = dict(g_scan.flat_state())
        assert ("transformer_blocks", 2, "attn", "to_q", "lora_b") in flat
        for (path, a), (_, b) in zip(g_scan.flat_state(), g_loop.flat_state(), strict=True):
            a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
            assert np.abs(a).max() > 0, path
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * np.abs(b).max())
