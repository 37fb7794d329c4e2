"""SANA-Video DiT (SanaVideoTransformer3DModel): the model conformance checks (forward parity
with diffusers on a padded text mask, bf16, logical axes, converter table, in-memory and CLI round
trips, remat, scan, sharding, bad options) plus SANA-Video's own: per-token timesteps, the text
mask, the RoPE'd linear attention against its quadratic definition and split over context,
load_transformer of a pipeline dir, the released config, bad inputs and sharded remat gradients.

Two variants: the spec's tiny config (§4.3: patch (1, 2, 2), q/k RMS norm across heads), and
patch (2, 2, 2) with every optional key on (guidance embedding, affine norm2, q/k/v biases, no
q/k norm), which exercises temporal patching and its unpatchify order. Both have 3 latent
frames after patching, so the temporal conv sees a frame with two neighbours.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import SanaVideoTransformer3DModel
from flax import nnx

from converters.loading import check_against_model
from converters.sana_transformer import build_video_table, make_video_model
from tests.conformance import ModelConformance
from tests.conformance.model import ATOL, eqns, jit_forward, torch_forward
from tests.models.sana._common import MASK, TEXT_LEN, TIMESTEPS
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_shapes
from wfm_jax.models.sana import SANA_VIDEO_2B, SanaVideoTransformer
from wfm_jax.models.sana.linear_attention import linear_attention
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
HW = (8, 6)  # grid 4 x 3: non-square
AXES = {"transformer_blocks.0.ff.conv_temp.kernel": (None, None, "embed", None)}


def _inputs(config, mask=True):
    rng = np.random.default_rng(0)
    frames = 3 * config["patch_size"][0]  # 3 latent frames after patching either way
    out = dict(hidden_states=rng.standard_normal((2, 4, frames, *HW), np.float32),
               encoder_hidden_states=rng.standard_normal((2, TEXT_LEN, 16), np.float32),
               timestep=TIMESTEPS)
    if mask:
        out["encoder_attention_mask"] = MASK
    if config.get("guidance_embeds"):
        out["guidance"] = np.array([4.5, 0.3], np.float32)
    return out


class TestSanaVideoTransformer(ModelConformance):
    torch_class = SanaVideoTransformer3DModel
    build_table, make_model = staticmethod(build_video_table), staticmethod(make_video_model)
    base, variants = BASE, VARIANTS
    missing_key = "transformer_blocks.0.ff.conv_temp.weight"
    wrong_shape = (missing_key, (24, 24, 1, 3))
    unexpected_key = "transformer_blocks.0.attn1.bogus"
    other_variant, other_match = "p222_all_options", "guidance_embedder"
    expected_axes = AXES
    cli_missing_key = "transformer_blocks.1.ff.conv_temp.weight"
    remat_grad_option = "dots_with_no_batch_dims_saveable"
    sharded_param = "transformer_blocks.0.attn1.to_q.kernel"
    sharded_batch_repeat = 2  # batch 4 so it divides data x fsdp
    attention_impl_match = "attention_impl"
    slow_tests = frozenset({"test_remat_matches_no_remat_values_and_grads"})  # ~20 s

    def inputs(self, variant, config):
        return [], _inputs(config)

    def model(self, case, **kw):
        return self.jax_model(case["config"], case["tensors"], **kw)

    def check_axes(self, params):
        assert params["patch_embedding.kernel"].out_sharding[-1] == "embed"

    def test_per_token_timesteps_match_diffusers(self):
        """diffusers broadcasts a (B, N) timestep per token through the blocks and the final norm."""
        case = self.case("tiny")
        tokens = 3 * 4 * 3
        inputs = dict(case["kwargs"], timestep=np.random.default_rng(5).integers(
            0, 1000, (2, tokens)).astype(np.int64))
        want = torch_forward(case["torch_model"], [], inputs)
        got = jit_forward(self.model(case))([], inputs)
        assert float(np.max(np.abs(got - want))) <= ATOL
        with pytest.raises(ValueError, match="timestep must be"):  # per frame does not broadcast
            jax.eval_shape(lambda: self.model(case)(**dict(inputs, timestep=np.zeros((2, 3)))))

    def test_text_mask_is_applied_and_self_attention_mask_refused(self):
        case = self.case("tiny")
        unmasked = _inputs(case["config"], mask=False)
        got = jit_forward(self.model(case))([], unmasked)
        assert float(np.max(np.abs(got - torch_forward(case["torch_model"], [], unmasked)))) <= ATOL
        assert float(np.max(np.abs(got - case["want"]))) > 1e-2
        with pytest.raises(ValueError, match="encoder_attention_mask"):
            self.model(case)(**unmasked, attention_mask=MASK)

    def test_rope_linear_attention_equals_its_quadratic_form(self):
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
        # under jit: eager, each of its ops would compile on its own
        got = jax.jit(linear_attention)(q, k, v, (cos.astype(np.float32), sin.astype(np.float32)))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)

    def test_load_transformer_from_a_pipeline_dir(self, tmp_path):
        """`load_transformer` of a pipeline dir serves its transformer/ and takes diffusers' keyword
        arguments."""
        from wfm_jax.models import load_transformer
        case = self.case("p222_all_options")
        case["torch_model"].save_pretrained(tmp_path / "transformer")
        (tmp_path / "model_index.json").write_text(json.dumps(
            {"_class_name": "SanaVideoPipeline",
             "transformer": ["diffusers", "SanaVideoTransformer3DModel"]}))
        model = load_transformer(str(tmp_path))
        assert isinstance(model, SanaVideoTransformer)
        got = jit_forward(model)([], case["kwargs"])
        assert float(np.max(np.abs(got - case["want"]))) <= ATOL

    def test_released_config_matches_diffusers_shapes(self):
        """SANA-Video 2B 480p as data: diffusers' parameter shapes (meta tensors) and the released
        count (spec §0: 2.057B). Built with one block."""
        one = {**SANA_VIDEO_2B, "num_layers": 1}
        with torch.device("meta"):
            ref = {k: tuple(v.shape)
                   for k, v in SanaVideoTransformer3DModel(**one).state_dict().items()}
        model = abstract_module(lambda: SanaVideoTransformer(one, rngs=nnx.Rngs(0)))
        check_against_model(build_video_table(one), {k: (s, "F32") for k, s in ref.items()}, model)
        sizes = {k: int(np.prod(s)) for k, s in flat_shapes(model).items()}
        block = sum(v for k, v in sizes.items() if k.startswith("transformer_blocks.0."))
        total = sum(sizes.values()) + (SANA_VIDEO_2B["num_layers"] - 1) * block
        assert abs(total / 1e9 - 2.057) < 0.001, total

    def test_bad_inputs_fail_clearly(self):
        model = abstract_module(lambda: SanaVideoTransformer(BASE, rngs=nnx.Rngs(0)))
        graph, state = nnx.split(model)
        run = lambda **kw: jax.eval_shape(lambda s: nnx.merge(graph, s)(**{**_inputs(BASE), **kw}),
                                          state)
        with pytest.raises(ValueError, match="not divisible by patch_size"):
            run(hidden_states=np.zeros((2, 4, 3, 7, 6), np.float32))
        with pytest.raises(ValueError, match="rope_max_seq_len"):
            run(hidden_states=np.zeros((2, 4, 40, 2, 2), np.float32))
        g = abstract_module(lambda: SanaVideoTransformer({**BASE, "guidance_embeds": True},
                                                        rngs=nnx.Rngs(0)))
        graph_g, state_g = nnx.split(g)
        with pytest.raises(ValueError, match="pass guidance"):
            jax.eval_shape(lambda s: nnx.merge(graph_g, s)(**_inputs(BASE)), state_g)

    @pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
    @pytest.mark.parametrize("rope", [False, True])
    def test_context_parallel_linear_attention_equals_unsplit(self, rope):
        """Tokens split over context (and batch over data x fsdp): one psum of the state and key sum
        gives the unsplit result; the model takes this path under such a mesh (jaxpr: a shard_map
        whose psums carry the local (B/4, H, d, d) state and (B/4, H, d) key sum, nothing else), and
        keeps the plain one without a mesh."""
        from wfm_jax.core.mesh import make_mesh
        from wfm_jax.models.sana.linear_attention import context_parallel_linear_attention, sequence_split
        rng = np.random.default_rng(4)
        grid, d = (2, 3, 4), 12
        q, k, v = (rng.standard_normal((4, 24, 2, d)).astype(np.float32) for _ in range(3))
        q, k = np.maximum(q, 0), np.maximum(k, 0)
        tables = tuple(jnp.asarray(t) for t in rope_tables(d, grid, 32)) if rope else None
        want = np.asarray(jax.jit(linear_attention)(q, k, v, tables))  # jit: not op by op
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
        whole = jax.jit(jax.grad(loss(linear_attention), argnums=(0, 1, 2)))(q, k, v)
        # and the same gradients (training under context parallel)
        for a, b in zip(split, whole, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        assert sequence_split(24, 4, 2) is None  # no mesh
        case = self.case("tiny")
        graph, state = nnx.split(self.model(case))
        inputs = {k_: np.concatenate([v_, v_]) if np.ndim(v_) else v_
                  for k_, v_ in case["kwargs"].items()}
        with jax.set_mesh(mesh):
            jaxpr = jax.make_jaxpr(lambda s, kw: nnx.merge(graph, s)(**kw))(state, inputs).jaxpr
        maps = [e for e in eqns(jaxpr) if e.primitive.name == "shard_map"]
        assert len(maps) == 2 * BASE["num_layers"]  # per block: the attention's, the temporal conv's
        psums = [e for e in eqns(jaxpr) if e.primitive.name in ("psum", "psum_invariant")]
        assert sorted(tuple(v_.aval.shape) for e in psums for v_ in e.outvars) == sorted(
            [(1, 2, 12, 12), (1, 2, 12)] * BASE["num_layers"])

    @pytest.mark.slow  # two backward compiles, 17-27 s on the shared 2-core box
    @pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
    def test_sharded_remat_gradients_match_unsharded(self):
        """A training step's gradients under (data=2, fsdp=2, context=2) with remat equal the plain
        ones. (This caught XLA mis-partitioning a grouped conv's kernel gradient: the depthwise conv
        is written as shifted products for that reason.)"""
        from wfm_jax.core.mesh import make_mesh, param_shardings
        case = self.case("tiny")
        inputs = {k: np.concatenate([v, v]) if np.ndim(v) else v for k, v in case["kwargs"].items()}

        def value_and_grad(remat, mesh):
            model = self.model(case, remat=remat)
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
