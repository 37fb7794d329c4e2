"""AutoencoderKL (SD3 VAE): the converter conformance checks (table, bit-identical round trips
that diffusers loads, bad checkpoints naming the key) plus encode/decode parity with diffusers
torch on identical weights, bf16, sharding and the VAE's own behaviour."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL as TorchAutoencoderKL
from flax import nnx

from converters.registry import spec_for
from converters.table import ConversionError, convert_to_jax
from converters.vae import build_table, make_model
from tests.conformance import ConverterConformance
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_params, flat_shapes
from wfm_jax.models.vae import (
    AutoencoderKL,
    DiagonalGaussian,
    scale_latents,
    unscale_latents,
    vae_scale_factor,
)

ATOL = 2e-5

# The design's tiny SD3 recipe (one block, no quant convs) and a two-block VAE with quant convs, so
# downsampling, upsampling, channel-changing shortcuts and quant convs are all exercised.
CONFIGS = {
    "one_block": dict(block_out_channels=(8,), layers_per_block=1, latent_channels=4,
                      norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False),
    "two_blocks": dict(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4,
                       norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 2,
                       up_block_types=("UpDecoderBlock2D",) * 2, use_quant_conv=True,
                       use_post_quant_conv=True),
}
SHAPES = [(32, 32), (32, 48)]


def random_torch_vae(kwargs: dict, seed: int = 0) -> TorchAutoencoderKL:
    torch.manual_seed(seed)
    vae = TorchAutoencoderKL(**kwargs).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            noise = torch.randn_like(p) * 0.1
            # norm scales stay near 1 so activations keep their size through the network
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return vae


class TestAutoencoderKLConverter(ConverterConformance):
    torch_class = TorchAutoencoderKL
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    variants = CONFIGS
    config_from_torch = True
    bad_checkpoint_variant = "two_blocks"
    missing_key = "decoder.up_blocks.0.upsamplers.0.conv.weight"
    unexpected_key = "encoder.mid_block.attentions.0.query.weight"
    wrong_shape = ("encoder.conv_in.weight", (8, 3, 1, 1))

    def build_torch(self, config):
        return random_torch_vae(config)


def loaders(state: dict) -> dict:
    return {k: (lambda v=v: v) for k, v in state.items()}


def torch_state(vae) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in vae.state_dict().items()}


def abstract_vae(config: dict, **kw) -> AutoencoderKL:
    return abstract_module(lambda: AutoencoderKL(config, rngs=nnx.Rngs(0), **kw))


def load_jax(vae, state=None, **kw) -> AutoencoderKL:
    """Checkpoint -> table -> model; the model is built abstractly (no random init to pay for)."""
    config = dict(vae.config)
    model = abstract_vae(config, **kw)
    flat = convert_to_jax(build_table(config), loaders(state or torch_state(vae)),
                          flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], var.dtype))
    return model


def jitted(model, fn):
    """fn(model, *args) under one jax.jit, with the model's state passed as an argument."""
    graph, state = nnx.split(model)
    compiled = jax.jit(lambda s, *a: fn(nnx.merge(graph, s), *a))
    return lambda *a: compiled(state, *a)


def encode_and_decode(model, x, z):
    return model.encode(x), model.decode(z)


@pytest.fixture(scope="module")
def outputs():
    """(config name, (H, W)) -> torch and jax encode/decode outputs, computed once per case."""
    models, results = {}, {}

    def get(name: str, hw: tuple[int, int]):
        if (name, hw) in results:
            return results[name, hw]
        if name not in models:
            vae = random_torch_vae(CONFIGS[name])
            models[name] = (vae, jitted(load_jax(vae), encode_and_decode))
        vae, run = models[name]
        f = vae_scale_factor(vae.config)
        gen = torch.Generator().manual_seed(1)
        x = torch.rand(2, 3, *hw, generator=gen) * 2 - 1
        z = torch.randn(2, 4, hw[0] // f, hw[1] // f, generator=gen)
        with torch.no_grad():
            want = vae.encode(x).latent_dist, vae.decode(z).sample
        results[name, hw] = want, run(jnp.asarray(x.numpy()), jnp.asarray(z.numpy())), f, x
        return results[name, hw]

    return get


CASES = [(name, hw) for name in CONFIGS for hw in SHAPES]
CASE_IDS = [f"{name}-{h}x{w}" for name, (h, w) in CASES]


@pytest.mark.parametrize("name,hw", CASES, ids=CASE_IDS)
def test_encode_matches_diffusers(outputs, name, hw):
    (dist, _), (got, _), f, _ = outputs(name, hw)
    assert got.mean.shape == (2, 4, hw[0] // f, hw[1] // f)
    assert got.mean.dtype == jnp.float32 and got.logvar.dtype == jnp.float32
    assert dist.mean.std() > 0.05  # the comparison below is not between near-zero tensors
    np.testing.assert_allclose(np.asarray(got.mean), dist.mean.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.asarray(got.logvar), dist.logvar.numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("name,hw", CASES, ids=CASE_IDS)
def test_decode_matches_diffusers(outputs, name, hw):
    (_, want), (_, got), _, _ = outputs(name, hw)
    assert got.shape == (2, 3, *hw) and got.dtype == jnp.float32
    assert want.std() > 0.05
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=0, atol=ATOL)


def test_bf16_compute_stays_close_to_fp32(outputs):
    # bf16 keeps 8 mantissa bits (relative step ~4e-3); through the ~15 conv/norm/attention stages
    # of this tiny encoder the rounding stays within a few percent of the output scale.
    (dist, _), _, _, x = outputs("two_blocks", (32, 32))
    model = load_jax(random_torch_vae(CONFIGS["two_blocks"]), dtype=jnp.bfloat16)
    got = jitted(model, lambda m, x: m.encode(x).mean)(jnp.asarray(x.numpy()))
    assert got.dtype == jnp.float32  # outputs are fp32 whatever the compute dtype
    want = dist.mean.numpy()
    error = float(np.max(np.abs(np.asarray(got) - want)))
    assert 0 < error < 0.05 * np.max(np.abs(want))  # 0 would mean bf16 was not used


@pytest.fixture(scope="module")
def checkpoint():
    vae = random_torch_vae(CONFIGS["two_blocks"])
    config = dict(vae.config)
    shapes = flat_shapes(abstract_vae(config))
    return config, torch_state(vae), shapes


def test_config_without_quant_convs_rejects_checkpoint_with_them(checkpoint):
    config, state, _ = checkpoint
    config = dict(config, use_quant_conv=False, use_post_quant_conv=False)
    with pytest.raises(ConversionError, match=r"unexpected.*post_quant_conv\.bias"):
        convert_to_jax(build_table(config), loaders(state))


def test_registry_serves_the_vae(checkpoint):
    config, _, shapes = checkpoint
    spec = spec_for({**config, "_class_name": "AutoencoderKL"})
    model = abstract_module(lambda: spec.make_model(config, rngs=nnx.Rngs(0)))
    assert flat_shapes(model) == shapes
    assert {r.jax for r in spec.build_table(config)} == set(shapes)


def test_unsupported_block_type_is_named():
    with pytest.raises(ValueError, match="AttnDownEncoderBlock2D"):
        AutoencoderKL(dict(CONFIGS["one_block"], down_block_types=("AttnDownEncoderBlock2D",)),
                      rngs=nnx.Rngs(0))


def test_latent_scaling_matches_sd3_pipeline_formula():
    sd3 = {"shift_factor": 0.0609, "scaling_factor": 1.5305}
    z = np.random.default_rng(0).normal(size=(2, 16, 4, 4)).astype(np.float32)
    scaled = scale_latents(jnp.asarray(z), sd3)
    np.testing.assert_allclose(np.asarray(scaled), (z - 0.0609) * 1.5305, rtol=1e-6, atol=1e-6)
    # the SD3 pipeline decodes latents / scaling_factor + shift_factor
    np.testing.assert_allclose(np.asarray(unscale_latents(scaled, sd3)), z, rtol=1e-5, atol=1e-5)
    no_shift = {"shift_factor": None, "scaling_factor": 0.18215}
    np.testing.assert_allclose(np.asarray(scale_latents(jnp.asarray(z), no_shift)), z * 0.18215,
                               rtol=1e-6)


def test_gaussian_sample_is_mean_plus_std_noise():
    moments = np.random.default_rng(0).normal(size=(1, 8, 3, 3)).astype(np.float32) * 20
    dist = DiagonalGaussian.from_moments(jnp.asarray(moments))
    key = jax.random.key(0)
    noise = np.asarray(jax.random.normal(key, (1, 4, 3, 3)))
    logvar = np.clip(moments[:, 4:], -30.0, 20.0)
    np.testing.assert_allclose(np.asarray(dist.sample(key)),
                               moments[:, :4] + np.exp(0.5 * logvar) * noise, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(dist.mode()), moments[:, :4])


def test_sharded_on_mesh_matches_diffusers():
    # params placed by their logical names, batch split over (data, fsdp): same numbers as torch
    from wfm_jax.core.mesh import make_mesh, param_shardings
    vae = random_torch_vae(CONFIGS["one_block"])
    model = load_jax(vae)
    mesh = make_mesh(data=2, fsdp=jax.device_count() // 2)
    shardings = param_shardings(model, mesh)
    for key, var in flat_params(model).items():
        var.set_value(jax.device_put(var.get_value(), shardings[key]))
    x = torch.rand(jax.device_count(), 3, 16, 16, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
        want = vae.decode(dist.mean).sample.numpy()
    run = jitted(model, lambda m, x: m.decode(m.encode(x).mean))
    with jax.set_mesh(mesh):
        xs = jax.device_put(jnp.asarray(x.numpy()), jax.NamedSharding(mesh, jax.P(("data", "fsdp"))))
        got = run(xs)
    assert not got.sharding.is_fully_replicated  # the batch stays split across devices
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=ATOL)


def test_query_chunked_attention_is_plain_attention():
    from wfm_jax.models.vae.blocks import query_chunked_attention
    r = np.random.default_rng(0)
    q, k, v = (jnp.asarray(r.standard_normal((2, 2500, 1, 8)), jnp.float32) for _ in range(3))
    want = jax.nn.dot_product_attention(q, k, v)
    got = jax.jit(query_chunked_attention, static_argnums=3)(q, k, v, 1024)  # 2500: a ragged end
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


def test_large_decode_does_not_hold_every_attention_score():
    # the tiny VAE does not downsample: 2 images at 192 px attend over 36864 positions, and the
    # unchunked mid-block attention compiled to 32.6 GB of temporaries (generate died there)
    from wfm_jax.families import tiny
    from wfm_jax.families.sd3.pipeline import decode_latents
    cfg = tiny.vae_config()
    graphdef, state = nnx.split(abstract_module(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0))))
    latents = jax.ShapeDtypeStruct((2, 4, 192, 192), jnp.float32)
    decode = jax.jit(lambda s, x: decode_latents(nnx.merge(graphdef, s), cfg, x))
    temp = decode.lower(state, latents).compile().memory_analysis().temp_size_in_bytes
    assert temp < 4e9, f"{temp / 1e9:.1f} GB"
