"""Wan DiT (WanTransformer3DModel): the model conformance checks (forward parity with diffusers,
bf16, logical axes, converter table, in-memory and CLI round trips, remat, scan, sharding, bad
options) on tiny random diffusers models, plus Wan's own: the RoPE tables, the released configs,
bad inputs and the LoRA targets.

Every weight is re-drawn (norm weights and biases too, so a swapped mapping shows). Two
variants: patch (1, 2, 2) with the cross-attention norm, and patch (2, 2, 2) without it
(exercises the temporal patching and unpatchify order). diffusers' forward takes no text
attention mask (the pipeline feeds zero-padded UMT5 rows that are attended), so there is no
masked variant to compare.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel
from flax import nnx

from converters.loading import check_against_model
from converters.wan_transformer import build_table, make_model
from tests.conformance import ModelConformance
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_shapes
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

AXES = {"blocks.0.attn1.to_q.kernel": ("embed", "heads"),
        "blocks.1.attn2.to_out.0.kernel": ("heads", "embed"),
        "blocks.0.ffn.net.0.proj.kernel": ("embed", "mlp"),
        "blocks.0.attn1.norm_q.scale": ("heads",)}


def _inputs(config):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(SHAPE[:1] + (config["in_channels"],) + SHAPE[2:], np.float32),
            TIMESTEPS,
            rng.standard_normal((SHAPE[0], TEXT_LEN, config["text_dim"]), np.float32)]


class TestWanTransformer(ModelConformance):
    torch_class = WanTransformer3DModel
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    base, variants = BASE, VARIANTS
    missing_key = "blocks.0.attn1.to_q.weight"
    wrong_shape = (missing_key, (3, 24))
    unexpected_key = "blocks.0.attn1.bogus"
    # a checkpoint without the cross-attention norm has keys this table lacks and vice versa
    other_variant, other_match = "p222_no_norm", "norm2"
    expected_axes = AXES
    cli_missing_key = "blocks.1.attn2.norm_k.weight"
    sharded_param = "blocks.0.attn1.to_q.kernel"
    # two backward compiles, ~50 s on a shared 2-core box
    slow_tests = frozenset({"test_remat_matches_no_remat_values_and_grads"})

    def inputs(self, variant, config):
        return _inputs(config), {}

    def check_torch_bf16(self, model):
        # measured: 0.73% vs diffusers' 0.59%
        assert model.blocks[0].scale_shift_table.dtype == torch.float32  # its fp32 islands

    def test_rope_tables_equal_diffusers(self):
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

    @pytest.mark.parametrize("name, config", [("1.3B", WAN21_T2V_1_3B), ("14B", WAN21_T2V_14B)])
    def test_released_configs_match_diffusers_shapes(self, name, config):
        """The configs as data: the same parameter shapes as diffusers builds (meta tensors), and
        the released parameter count. Built with one block (the blocks are identical)."""
        one = {**config, "num_layers": 1}
        with torch.device("meta"):
            ref = {k: tuple(v.shape) for k, v in WanTransformer3DModel(**one).state_dict().items()}
        model = abstract_module(lambda: WanTransformer(one, rngs=nnx.Rngs(0)))
        check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
        sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
        block = sum(v for k, v in sizes.items() if k.startswith("blocks.0."))
        total = sum(sizes.values()) + (config["num_layers"] - 1) * block
        assert abs(total / 1e9 - {"1.3B": 1.419, "14B": 14.29}[name]) < 0.01  # spec §0 [meas]

    def test_bad_config_and_inputs_fail_clearly(self):
        with pytest.raises(ValueError, match="image-to-video"):
            abstract_module(lambda: WanTransformer({**BASE, "image_dim": 16}, rngs=nnx.Rngs(0)))
        graph, state = nnx.split(abstract_module(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0))))
        _, t, text = _inputs(BASE)
        odd = np.zeros((2, 4, 3, 7, 6), np.float32)  # H=7 not divisible by patch 2
        with pytest.raises(ValueError, match="not divisible by patch_size"):
            jax.eval_shape(lambda s: nnx.merge(graph, s)(odd, t, text), state)

    def test_lora_targets_address_diffusers_module_names(self):
        """The Wan LoRA list (spec video_models.md §5.5) finds the same layers peft would."""
        from wfm_jax.models.lora import find_targets
        model = abstract_module(lambda: WanTransformer(BASE, rngs=nnx.Rngs(0)))
        found = find_targets(model, ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj",
                                     "ffn.net.2"])
        assert len(found) == BASE["num_layers"] * (2 * 4 + 2)
        assert "blocks.1.attn2.to_out.0" in found and "blocks.0.ffn.net.2" in found
        assert not any(p.startswith("condition_embedder") for p in found)
