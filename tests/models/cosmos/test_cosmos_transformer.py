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

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import CosmosTransformer3DModel
from diffusers.models.transformers import transformer_cosmos
from flax import nnx

from converters.cosmos_transformer import build_table, make_model
from converters.loading import check_against_model
from tests.conformance import ModelConformance
from tests.conformance.model import to_torch
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_shapes
from wfm_jax.models.cosmos import COSMOS25_PREDICT_2B, COSMOS25_PREDICT_14B, CosmosTransformer
from wfm_jax.models.cosmos.embeddings import resize_nearest
from wfm_jax.models.cosmos.rope import rope_tables

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

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

AXES = {"transformer_blocks.0.attn1.to_q.kernel": ("embed", "heads"),
        "transformer_blocks.1.attn2.to_out.0.kernel": ("heads", "embed"),
        "transformer_blocks.0.ff.net.0.proj.kernel": ("embed", "mlp"),
        "transformer_blocks.0.norm1.linear_2.kernel": (None, "embed"),
        "crossattn_proj.0.kernel": (None, "embed")}


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


class TestCosmosTransformer(ModelConformance):
    torch_class = CosmosTransformer3DModel
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    base, variants = BASE, VARIANTS
    missing_key = "transformer_blocks.0.attn1.to_q.weight"
    wrong_shape = (missing_key, (3, 24))
    unexpected_key = "transformer_blocks.0.attn1.bogus"
    other_variant, other_match = "frames", "crossattn_proj"  # without crossattn_proj: keys we lack
    bf16_variant = "frames"
    expected_axes = AXES
    cli_variant, cli_missing_key = "proj", "transformer_blocks.1.attn2.norm_k.weight"
    remat_variant = "frames"
    # per-frame sigmas (the pipeline's form) with a frame count (4) the context axis divides
    sharded_variant, sharded_param = "frames", "transformer_blocks.0.attn1.to_q.kernel"
    slow_tests = frozenset({"test_remat_matches_no_remat_values_and_grads"})  # two backward compiles

    def inputs(self, variant, config):
        return _inputs(variant, config)

    def test_masks_and_per_frame_sigmas_reach_the_output(self):
        """The parity variants exercise every input: changing the condition mask, the padding mask
        or one frame's sigma changes diffusers' output (so a port ignoring one would fail)."""
        case = self.case("frames")
        args, kwargs = case["args"], case["kwargs"]
        sigma = args[1].copy()
        sigma[:, :, 0] = 0.7
        changed = [((args[0], sigma, args[2]), kwargs),
                   (args, {**kwargs, "condition_mask": np.zeros_like(kwargs["condition_mask"])}),
                   (args, {**kwargs, "padding_mask": np.zeros_like(kwargs["padding_mask"])}),
                   (args, {**kwargs, "fps": None})]
        for a, k in changed:
            ta, tk = to_torch(a, k)
            with torch.no_grad():
                out = case["torch_model"](*ta, **tk, return_dict=False)[0].numpy()
            assert np.max(np.abs(out - case["want"])) > 1e-3

    @pytest.mark.parametrize("head_dim, max_size, scale, grid, fps", [
        (128, (128, 240, 240), (1.0, 3.0, 3.0), (24, 30, 40), None),  # Predict2.5, 720p-ish grid
        (12, (8, 32, 32), (1.0, 3.0, 3.0), (3, 4, 4), None),
        (128, (128, 240, 240), (2.0, 1.0, 1.0), (7, 5, 6), 16),
    ])
    def test_rope_tables_match_diffusers(self, head_dim, max_size, scale, grid, fps):
        """Within one float32 ulp: diffusers builds the tables with torch's float32 pow / cos / sin
        (not correctly rounded); ours round each step correctly. Both halves of diffusers' table are
        equal (the rotate-half layout), ours hold one."""
        from diffusers.models.transformers.transformer_cosmos import CosmosRotaryPosEmbed
        rope = CosmosRotaryPosEmbed(head_dim, max_size, (1, 2, 2), rope_scale=scale)
        cos_t, sin_t = rope(torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2]), fps=fps)
        positions = max(m // p for m, p in zip(max_size, (1, 2, 2), strict=True))
        cos, sin = rope_tables(head_dim, grid, positions, scale, fps)
        half = head_dim // 2
        for ours, theirs in ((cos, cos_t.numpy()), (sin, sin_t.numpy())):
            np.testing.assert_array_equal(theirs[:, :half], theirs[:, half:])
            # 2 ulps apart on this machine (2026-11-25, 8400 of 1.8M values), unchanged code: 4 ulps
            np.testing.assert_allclose(ours, theirs[:, :half], rtol=0, atol=2 ** -21)
        with pytest.raises(ValueError, match="exceeds the RoPE table"):
            rope_tables(head_dim, (2, positions + 1, 3), positions, scale)

    @pytest.mark.parametrize("size_in, size_out", [((64, 64), (8, 6)), ((13, 11), (8, 6)),
                                                   ((3, 5), (8, 6)), ((8, 6), (8, 6)),
                                                   ((7, 9), (14, 27))])
    def test_padding_mask_resize_is_torch_nearest(self, size_in, size_out):
        x = np.random.default_rng(0).standard_normal((2, 1, *size_in)).astype(np.float32)
        want = F.interpolate(torch.from_numpy(x), size=list(size_out), mode="nearest").numpy()
        np.testing.assert_array_equal(np.asarray(resize_nearest(jnp.asarray(x), *size_out)), want)

    def test_load_transformer_takes_diffusers_keywords(self, tmp_path):
        """wfm_jax.models.load_transformer on a diffusers dir and on the converted state dir gives
        the Cosmos model, called with the diffusers forward's keyword arguments."""
        from converters.cli import main as converters_main
        from wfm_jax.models import load_transformer
        case = self.case("proj")
        case["torch_model"].save_pretrained(tmp_path / "hf")
        assert converters_main(["to-jax", str(tmp_path / "hf"), str(tmp_path / "jax")]) == 0
        (x, t, text), kwargs = case["args"], case["kwargs"]
        # one jitted forward for both loads (eager, every op of the model compiles on its own)
        forward = nnx.jit(lambda model, kw: model(**kw))
        for path in (tmp_path / "hf", tmp_path / "jax"):
            model = load_transformer(str(path))
            assert isinstance(model, CosmosTransformer)
            got = np.asarray(forward(model, dict(
                hidden_states=x, timestep=t, encoder_hidden_states=text,
                condition_mask=kwargs["condition_mask"], padding_mask=kwargs["padding_mask"])))
            assert float(np.max(np.abs(got - case["want"]))) <= ATOL

    @pytest.mark.parametrize("name, config", [("2B", COSMOS25_PREDICT_2B),
                                              ("14B", COSMOS25_PREDICT_14B)])
    def test_released_configs_match_diffusers_shapes(self, name, config):
        """The configs as data: the same parameter shapes as diffusers builds (meta tensors), and the
        released parameter count. Built with one block (the blocks are identical) to stay fast."""
        one = {**config, "num_layers": 1}
        with torch.device("meta"):
            ref = {k: tuple(v.shape) for k, v in CosmosTransformer3DModel(**one).state_dict().items()}
        model = abstract_module(lambda: CosmosTransformer(one, rngs=nnx.Rngs(0)))
        check_against_model(build_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
        sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
        assert sizes["patch_embed.proj.kernel"] == 72 * 128 * config["num_attention_heads"]
        block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
        total = sum(sizes.values()) + (config["num_layers"] - 1) * block
        assert abs(total / 1e9 - {"2B": 2.059, "14B": 14.37}[name]) < 0.01  # spec §0 [meas]

    def test_bad_config_and_inputs_fail_clearly(self):
        def build(**overrides):
            return abstract_module(lambda: CosmosTransformer({**BASE, **overrides}, rngs=nnx.Rngs(0)))

        with pytest.raises(ValueError, match="extra_pos_embed_type='learnable'"):
            build(extra_pos_embed_type="learnable")
        with pytest.raises(ValueError, match="image context"):
            build(img_context_dim_in=16)
        with pytest.raises(ValueError, match="attention_head_dim"):
            build(attention_head_dim=8)  # diffusers: ZeroDivisionError
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

    def test_lora_targets_address_diffusers_module_names(self):
        """cosmos-rl's Cosmos LoRA list (cosmos-predict2-5-2b-720-nft.toml; spec video_models.md
        §5.2) finds the same layers peft would: both attentions and the FFN of every block, not
        crossattn_proj."""
        from wfm_jax.models.lora import find_targets
        targets = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
        model = abstract_module(lambda: CosmosTransformer(BASE, rngs=nnx.Rngs(0)))
        found = set(find_targets(model, targets))
        torch_model = CosmosTransformer3DModel(**BASE)
        peft_like = {name for name, m in torch_model.named_modules()
                     if isinstance(m, torch.nn.Linear)
                     and any(name == t or name.endswith("." + t) for t in targets)}
        assert found == peft_like
        assert len(found) == BASE["num_layers"] * (2 * 4 + 2)
        assert not any(p.startswith("crossattn_proj") for p in found)
