"""SANA1.5 DiT (SanaTransformer2DModel): the model conformance checks (forward parity with
diffusers on a padded text mask, bf16, logical axes, converter table, in-memory and CLI round
trips, remat, scan, sharding with the linear attention's sums over the split sequence, bad
options) plus SANA's own: the text mask, the linear attention against its quadratic definition,
load_transformer, the released config, bad inputs and the LoRA targets.

Two variants: the spec's tiny config (§4.3: patch 1, q/k RMS norm across heads), and one that
switches on every optional key (patch 2, guidance embedding, sincos position embedding, affine
norm2, q/k/v biases, no q/k norm).
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from diffusers import SanaTransformer2DModel
from flax import nnx

from converters.loading import check_against_model
from converters.sana_transformer import build_table, make_model
from tests.conformance import ModelConformance
from tests.conformance.model import ATOL, jit_forward, torch_forward
from tests.models.sana._common import MASK, TEXT_LEN, TIMESTEPS
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_shapes
from wfm_jax.models.sana import SANA15_1600M, SanaTransformer
from wfm_jax.models.sana.linear_attention import linear_attention

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
AXES = {"transformer_blocks.0.attn1.to_q.kernel": ("embed", "heads"),
        "transformer_blocks.0.attn2.to_out.0.kernel": ("heads", "embed"),
        "transformer_blocks.0.ff.conv_inverted.kernel": (None, None, "embed", "mlp"),
        "transformer_blocks.0.ff.conv_point.kernel": (None, None, "mlp", "embed")}


def _inputs(config, mask=True):
    rng = np.random.default_rng(0)
    out = dict(hidden_states=rng.standard_normal(SHAPE, np.float32),
               encoder_hidden_states=rng.standard_normal((2, TEXT_LEN, 16), np.float32),
               timestep=TIMESTEPS)
    if mask:
        out["encoder_attention_mask"] = MASK
    if config.get("guidance_embeds"):
        out["guidance"] = np.array([4.5, 0.3], np.float32)
    return out


class TestSanaTransformer(ModelConformance):
    torch_class = SanaTransformer2DModel
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    base, variants = BASE, VARIANTS
    missing_key = "transformer_blocks.0.attn1.to_q.weight"
    wrong_shape = (missing_key, (3, 16))
    unexpected_key = "transformer_blocks.0.attn1.bogus"
    # guidance embedder, biases, no q/k norms: keys this table lacks
    other_variant, other_match = "p2_all_options", "guidance_embedder"
    axes_config, expected_axes = VARIANTS["p2_all_options"], AXES
    cli_variant, cli_missing_key = "p2_all_options", "transformer_blocks.1.ff.conv_depth.bias"
    sharded_param = "transformer_blocks.0.attn1.to_q.kernel"
    sharded_batch_repeat = 2  # batch 4 so it divides data x fsdp
    attention_impl_match = "attention_impl"

    def inputs(self, variant, config):
        return [], _inputs(config)

    def model(self, case, **kw):
        return self.jax_model(case["config"], case["tensors"], **kw)

    def test_text_mask_is_applied_and_self_attention_mask_refused(self):
        """The padded mask changes the output (so the parity above tests it), as in diffusers; the
        self-attention `attention_mask`, which diffusers silently ignores, is refused."""
        case = self.case("tiny")
        forward = jit_forward(self.model(case))
        unmasked = _inputs(case["config"], mask=False)
        got = forward([], unmasked)
        want = torch_forward(case["torch_model"], [], unmasked)
        assert float(np.max(np.abs(got - want))) <= ATOL
        assert float(np.max(np.abs(got - case["want"]))) > 1e-2
        with pytest.raises(ValueError, match="encoder_attention_mask"):
            self.model(case)(**unmasked, attention_mask=MASK)

    def test_linear_attention_equals_its_quadratic_form(self):
        """out_n = sum_m (q_n . k_m) v_m / (sum_m q_n . k_m + 1e-15) with q, k >= 0."""
        rng = np.random.default_rng(3)
        q, k, v = (rng.standard_normal((2, 11, 3, 5)).astype(np.float32) for _ in range(3))
        q, k = np.maximum(q, 0), np.maximum(k, 0)
        scores = np.einsum("bnhd,bmhd->bhnm", q.astype(np.float64), k)
        want = np.einsum("bhnm,bmhe->bnhe", scores, v) / (scores.sum(-1).transpose(0, 2, 1)[..., None]
                                                           + 1e-15)
        np.testing.assert_allclose(np.asarray(linear_attention(q, k, v)), want, rtol=2e-5, atol=1e-6)

    def test_load_transformer_from_a_diffusers_dir(self, tmp_path):
        """`wfm_jax.models.load_transformer` serves the class by its config and takes diffusers'
        keyword arguments."""
        from wfm_jax.models import load_transformer
        case = self.case("p2_all_options")
        case["torch_model"].save_pretrained(tmp_path)
        model = load_transformer(str(tmp_path))
        assert isinstance(model, SanaTransformer)
        got = jit_forward(model)([], case["kwargs"])
        assert float(np.max(np.abs(got - case["want"]))) <= ATOL

    def test_released_config_matches_diffusers_shapes(self):
        """SANA1.5 1.6B as data: diffusers' parameter shapes (meta tensors) and the released count
        (spec §0: 1.605B). Built with one block (the blocks are identical)."""
        one = {**SANA15_1600M, "num_layers": 1}
        with torch.device("meta"):
            ref = {k: tuple(v.shape) for k, v in SanaTransformer2DModel(**one).state_dict().items()}
        model = abstract_module(lambda: SanaTransformer(one, rngs=nnx.Rngs(0)))
        check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
        sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
        block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
        total = sum(sizes.values()) + (SANA15_1600M["num_layers"] - 1) * block
        assert abs(total / 1e9 - 1.605) < 0.001, total

    def test_bad_config_and_inputs_fail_clearly(self):
        def build(**kw):
            return abstract_module(lambda: SanaTransformer({**BASE, **kw}, rngs=nnx.Rngs(0)))
        with pytest.raises(ValueError, match="qk_norm"):
            build(qk_norm="layer_norm")
        with pytest.raises(ValueError, match="cross_attention_dim"):
            build(cross_attention_dim=12)
        graph, state = nnx.split(build())
        run = lambda **kw: jax.eval_shape(lambda s: nnx.merge(graph, s)(**{**_inputs(BASE), **kw}),
                                          state)
        with pytest.raises(ValueError, match="encoder_attention_mask must be"):
            run(encoder_attention_mask=MASK[:, :5])
        with pytest.raises(ValueError, match="timestep must be"):
            run(timestep=np.zeros((2, 3)))
        with pytest.raises(ValueError, match="no guidance embedding"):
            run(guidance=np.ones(2))
        p2 = abstract_module(lambda: SanaTransformer({**BASE, "patch_size": 2}, rngs=nnx.Rngs(0)))
        graph2, state2 = nnx.split(p2)
        with pytest.raises(ValueError, match="not divisible by patch_size"):
            jax.eval_shape(lambda s: nnx.merge(graph2, s)(**{**_inputs(BASE), "hidden_states":
                                                             np.zeros((2, 4, 7, 6), np.float32)}),
                           state2)

    def test_lora_targets_address_diffusers_module_names(self):
        """cosmos-rl's SANA LoRA targets (spec §5.3) find the same layers peft would."""
        from wfm_jax.models.lora import find_targets
        model = abstract_module(lambda: SanaTransformer(BASE, rngs=nnx.Rngs(0)))
        found = find_targets(model, ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                     "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"])
        assert len(found) == BASE["num_layers"] * 8
        assert "transformer_blocks.1.attn2.to_out.0" in found
