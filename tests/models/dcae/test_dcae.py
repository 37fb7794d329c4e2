"""AutoencoderDC (SANA's DC-AE): the converter conformance checks (table, bit-identical round
trips that diffusers loads, bad checkpoints naming the key) plus encode/decode parity with
diffusers torch on identical weights, bf16, sharding and the DC-AE's own configs and errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderDC as TorchAutoencoderDC
from flax import nnx

from converters.dcae import build_table, make_model
from converters.registry import spec_for
from converters.table import convert_to_jax
from tests.conformance import ConverterConformance
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_params, flat_shapes
from wfm_jax.models.dcae import AutoencoderDC, DCAEConfig, scale_latents, unscale_latents

ATOL = 2e-5

CONFIGS = {
    # spec §4.3's tiny SANA VAE: stride-2 "Conv" down, "interpolate" up, factor 2
    "spec": dict(in_channels=3, latent_channels=4, attention_head_dim=2,
                 encoder_block_types=("ResBlock", "EfficientViTBlock"),
                 decoder_block_types=("ResBlock", "EfficientViTBlock"),
                 encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                 encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                 encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                 downsample_block_type="Conv", upsample_block_type="interpolate",
                 decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407),
    # diffusers' default pixel_unshuffle / pixel_shuffle blocks, a skipped first stage on both
    # sides (conv_in / conv_out become DC blocks), two multi-scale branches, per-block
    # activations, channel-changing shortcuts; factor 4
    "shuffle": dict(in_channels=3, latent_channels=4, attention_head_dim=4,
                    encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
                    decoder_block_types=("ResBlock", "EfficientViTBlock", "EfficientViTBlock"),
                    encoder_block_out_channels=(8, 16, 16), decoder_block_out_channels=(8, 16, 16),
                    encoder_layers_per_block=(0, 1, 2), decoder_layers_per_block=(0, 2, 1),
                    encoder_qkv_multiscales=((), (), (3, 5)),
                    decoder_qkv_multiscales=((), (5,), (3,)), decoder_norm_types="rms_norm",
                    decoder_act_fns=("silu", "relu", "silu")),
}
# Pixel sizes per config. The EfficientViT stages switch to quadratic attention when the map has
# at most head_dim positions: "spec" at 2x4 px (a 1x2 map, head_dim 2), "shuffle" at 8x8 px (2x2,
# head_dim 4); the larger sizes run linear attention.
SHAPES = {"spec": [(16, 24), (2, 4)], "shuffle": [(16, 16), (8, 8)]}


def random_torch_vae(kwargs: dict, seed: int = 0) -> TorchAutoencoderDC:
    torch.manual_seed(seed)
    vae = TorchAutoencoderDC(**kwargs).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            noise = torch.randn_like(p) * 0.2
            # norm scales stay near 1 so activations keep their size through the network
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)
    return vae


class TestAutoencoderDCConverter(ConverterConformance):
    torch_class = TorchAutoencoderDC
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    variants = CONFIGS
    config_from_torch = True
    bad_checkpoint_variant = "spec"
    missing_key = "decoder.up_blocks.1.0.attn.to_qkv_multiscale.0.proj_out.weight"
    unexpected_key = "encoder.down_blocks.0.0.norm.running_mean"
    wrong_shape = ("encoder.down_blocks.1.0.conv_out.conv_depth.weight", (64, 2, 3, 3))  # depthwise

    def build_torch(self, config):
        return random_torch_vae(config)


def loaders(state: dict) -> dict:
    return {k: (lambda v=v: v) for k, v in state.items()}


def torch_state(vae) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in vae.state_dict().items()}


def abstract_vae(config: dict, **kw) -> AutoencoderDC:
    return abstract_module(lambda: AutoencoderDC(config, rngs=nnx.Rngs(0), **kw))


def load_jax(vae, state=None, **kw) -> AutoencoderDC:
    config = dict(vae.config)
    model = abstract_vae(config, **kw)
    flat = convert_to_jax(build_table(config), loaders(state or torch_state(vae)),
                          flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], var.dtype))
    return model


def jitted(model, fn):
    graph, state = nnx.split(model)
    compiled = jax.jit(lambda s, *a: fn(nnx.merge(graph, s), *a))
    return lambda *a: compiled(state, *a)


@pytest.fixture(scope="module")
def pairs():
    return {name: (lambda vae: (vae, load_jax(vae)))(random_torch_vae(kw))
            for name, kw in CONFIGS.items()}


CASES = [(name, hw) for name in CONFIGS for hw in SHAPES[name]]
CASE_IDS = [f"{name}-{h}x{w}" for name, (h, w) in CASES]


@pytest.mark.parametrize("name,hw", CASES, ids=CASE_IDS)
def test_encode_and_decode_match_diffusers(pairs, name, hw):
    vae, model = pairs[name]
    f = model.config.spatial_factor
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, *hw, generator=gen) * 2 - 1
    z = torch.randn(2, 4, hw[0] // f, hw[1] // f, generator=gen)
    with torch.no_grad():
        want_z, want_x = vae.encode(x).latent.numpy(), vae.decode(z).sample.numpy()
    got_z, got_x = jitted(model, lambda m, x, z: (m.encode(x), m.decode(z)))(
        jnp.asarray(x.numpy()), jnp.asarray(z.numpy()))
    assert got_z.shape == want_z.shape and got_z.dtype == jnp.float32
    assert got_x.shape == (2, 3, *hw) and got_x.dtype == jnp.float32
    assert want_z.std() > 0.1 and want_x.std() > 0.1
    np.testing.assert_allclose(np.asarray(got_z), want_z, rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.asarray(got_x), want_x, rtol=0, atol=ATOL)


def test_bf16_compute_tracks_fp32_like_diffusers_bf16(pairs):
    # these random weights amplify rounding (diffusers' own bf16 encode is ~10% off its fp32
    # one), so the bound is relative to diffusers run in bf16 on the same input
    vae, model = pairs["spec"]
    x = np.random.default_rng(2).uniform(-1, 1, (2, 3, 16, 16)).astype(np.float32)
    want = np.asarray(jitted(model, lambda m, x: m.encode(x))(jnp.asarray(x)))
    bf16 = load_jax(vae, dtype=jnp.bfloat16)
    got = jitted(bf16, lambda m, x: m.encode(x))(jnp.asarray(x))
    assert got.dtype == jnp.float32  # outputs are fp32 whatever the compute dtype
    with torch.no_grad():
        torch_bf16 = random_torch_vae(CONFIGS["spec"]).to(torch.bfloat16)
        ref = torch_bf16.encode(torch.from_numpy(x).bfloat16()).latent.float().numpy()
    err = float(np.max(np.abs(np.asarray(got) - want)))
    torch_err = float(np.max(np.abs(ref - want)))
    assert 0 < err < 1.5 * torch_err, (err, torch_err)  # 0 would mean bf16 was not used


@pytest.fixture(scope="module")
def checkpoint():
    vae = random_torch_vae(CONFIGS["spec"])
    config = dict(vae.config)
    return config, torch_state(vae), flat_shapes(abstract_vae(config))


def test_registry_serves_the_dcae(checkpoint):
    config, _, shapes = checkpoint
    spec = spec_for({**config, "_class_name": "AutoencoderDC"})
    model = abstract_module(lambda: spec.make_model(config, rngs=nnx.Rngs(0)))
    assert flat_shapes(model) == shapes
    assert {r.jax for r in spec.build_table(config)} == set(shapes)


def test_released_config_builds_with_diffusers_parameter_count():
    # dc-ae-f32c32-sana-1.0's published config (spec §1.3): 312M parameters [meas]
    sana = dict(latent_channels=32, attention_head_dim=32,
                encoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                decoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                encoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
                decoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
                encoder_layers_per_block=[2, 2, 2, 3, 3, 3],
                decoder_layers_per_block=[3, 3, 3, 3, 3, 3],
                encoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
                decoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
                downsample_block_type="Conv", upsample_block_type="interpolate",
                decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)
    with torch.device("meta"):
        want = TorchAutoencoderDC(**sana).state_dict()
    shapes = flat_shapes(abstract_vae(sana))
    assert sum(int(np.prod(s)) for s in shapes.values()) == sum(v.numel() for v in want.values())
    assert {r.hf for r in build_table(sana)} == set(want)
    assert DCAEConfig.from_dict(sana).spatial_factor == 32


@pytest.mark.parametrize("change, message", [
    (dict(decoder_norm_types="batch_norm"), "decoder norm type 'batch_norm'"),
    (dict(encoder_block_types=("ResBlock", "Attention")), "block type 'Attention'"),
    (dict(downsample_block_type="stride"), "downsample_block_type 'stride'"),
    (dict(decoder_act_fns="relu6"), "activation 'relu6'"),
    (dict(encoder_layers_per_block=(1,)), "encoder_layers_per_block has 1 entries"),
])
def test_unsupported_config_is_one_line(change, message):
    with pytest.raises(ValueError, match=message):
        DCAEConfig.from_dict({**CONFIGS["spec"], **change})


def test_bad_input_shapes_are_one_line(pairs):
    _, model = pairs["shuffle"]  # factor 4
    with pytest.raises(ValueError, match="multiples of 4, got shape \\(1, 3, 8, 10\\)"):
        model.encode(jnp.zeros((1, 3, 8, 10)))
    with pytest.raises(ValueError, match="decode takes \\(B, 4, h, w\\)"):
        model.decode(jnp.zeros((1, 3, 2, 2)))


def test_latent_scaling_is_sana_pipelines():
    # SanaModel.visual_embedding: latent * 0.41407; SanaPipeline decodes latents / 0.41407
    z = np.random.default_rng(0).normal(size=(2, 4, 3, 3)).astype(np.float32)
    scaled = scale_latents(jnp.asarray(z), CONFIGS["spec"])
    np.testing.assert_array_equal(np.asarray(scaled), z * np.float32(0.41407))
    np.testing.assert_allclose(np.asarray(unscale_latents(scaled, CONFIGS["spec"])), z,
                               rtol=1e-6)


def test_sharded_on_mesh_matches_diffusers():
    # params placed by their logical names, batch split over (data, fsdp): same numbers as torch
    from wfm_jax.core.mesh import make_mesh, param_shardings
    vae = random_torch_vae(CONFIGS["spec"])
    model = load_jax(vae)
    mesh = make_mesh(data=2, fsdp=jax.device_count() // 2)
    shardings = param_shardings(model, mesh)
    for key, var in flat_params(model).items():
        var.set_value(jax.device_put(var.get_value(), shardings[key]))
    x = torch.rand(jax.device_count(), 3, 8, 8, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        want = vae.decode(vae.encode(x).latent).sample.numpy()
    run = jitted(model, lambda m, x: m.decode(m.encode(x)))
    with jax.set_mesh(mesh):
        batch = jax.NamedSharding(mesh, jax.P(("data", "fsdp")))
        xs = jax.device_put(jnp.asarray(x.numpy()), batch)
        got = run(xs)
    assert not got.sharding.is_fully_replicated  # the batch stays split across devices
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=ATOL)
