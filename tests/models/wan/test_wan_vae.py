"""AutoencoderKLWan (the Wan2.1 video VAE): parity with diffusers torch on identical weights
(converted through the weight table), the chunked cache semantics, and the converter conformance
checks (table, bit-exact round trips that diffusers loads, bad checkpoints naming the key)."""
from __future__ import annotations

import os
from types import MappingProxyType

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan as TorchWanVAE
from diffusers.models.autoencoders import autoencoder_kl_wan as torch_wan
from flax import nnx
from safetensors import safe_open

from converters.cli import main as converters_main
from converters.registry import spec_for
from converters.table import convert_to_jax
from converters.wan_vae import _resample, build_table, make_model
from tests.conformance import ConverterConformance
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_params, flat_shapes
from wfm_jax.models.vae.blocks import Conv2d
from wfm_jax.models.wan.vae import (
    ENCODE_CHUNK,
    AutoencoderKLWan,
    WanVAEConfig,
    latent_frames,
    scale_latents,
    to_channels_first,
    to_channels_last,
    unscale_latents,
)
from wfm_jax.models.wan.vae_layers import CausalConv3d, Resample

ATOL = 2e-5  # module-level outputs (the encoder's moments)
DECODE_ATOL = 1e-4  # the chunked decode (the bound; measured ~3e-6)

# The spec's tiny Wan VAE (§4.2): two temporal and three spatial x2 stages, 32x32 px -> 4x4.
TINY = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4)


def random_torch_vae(kwargs: dict = TINY, seed: int = 0) -> TorchWanVAE:
    """diffusers' own init (non-zero convs and biases) with the norm gains moved off 1, so a
    wrongly mapped gamma shows."""
    torch.manual_seed(seed)
    vae = TorchWanVAE(**kwargs).eval()
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return vae


class TestWanVAEConverter(ConverterConformance):
    torch_class = TorchWanVAE
    build_table, make_model = staticmethod(build_table), staticmethod(make_model)
    base, variants = TINY, {"tiny": {}}
    config_from_torch = True
    # and a wider decoder, 2 resnets per level, no temporal downsampling in the last stage
    table_configs = MappingProxyType({"tiny": {}, "other": dict(
        decoder_base_dim=12, num_res_blocks=2, temperal_downsample=[False, True, False])})
    missing_key = "decoder.norm_out.gamma"
    unexpected_key = "encoder.bogus.gamma"
    wrong_shape = ("encoder.norm_out.gamma", (16, 1, 1, 1))

    def build_torch(self, config):
        return random_torch_vae(config)


def test_registry_serves_the_wan_vae():
    vae = random_torch_vae()
    assert spec_for({**vae.config, "_class_name": "AutoencoderKLWan"}).build_table is build_table


def torch_state(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def loaders(state: dict) -> dict:
    return {k: (lambda v=v: v) for k, v in state.items()}


def load_jax(vae) -> AutoencoderKLWan:
    config = dict(vae.config)
    model = abstract_module(lambda: AutoencoderKLWan(config, rngs=nnx.Rngs(0)))
    flat = convert_to_jax(build_table(config), loaders(torch_state(vae)), flat_shapes(model))
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[key], var.dtype))
    return model


def jitted(model, fn):
    graph, state = nnx.split(model)
    compiled = jax.jit(lambda s, *a: fn(nnx.merge(graph, s), *a))
    return lambda *a: compiled(state, *a)


@pytest.fixture(scope="module")
def pair():
    vae = random_torch_vae()
    model = load_jax(vae)
    return (vae, jitted(model, lambda m, x: m.encode_moments(x)),
            jitted(model, lambda m, z: m.decode(z)))


@pytest.fixture(scope="module")
def videos(pair):
    """frames -> (video, torch posterior, jax moments, latents, torch decode, jax decode)."""
    vae, encode, decode = pair
    gen = torch.Generator().manual_seed(1)
    out = {}
    for frames in (5, 9):
        x = torch.rand(2, 3, frames, 32, 32, generator=gen) * 2 - 1
        z = torch.randn(2, 4, latent_frames(frames), 4, 4, generator=gen)
        with torch.no_grad():
            dist, pixels = vae.encode(x).latent_dist, vae.decode(z).sample
        out[frames] = (x, dist, np.asarray(encode(jnp.asarray(x.numpy()))), z, pixels.numpy(),
                       np.asarray(decode(jnp.asarray(z.numpy()))))
    return out


@pytest.mark.slow  # ~30-60 s on 2 cores: four XLA compiles of the chunked encoder and decoder
@pytest.mark.parametrize("frames", [5, 9])
def test_encode_matches_diffusers(videos, frames):
    _, dist, moments, *_ = videos[frames]
    t = latent_frames(frames)
    assert moments.shape == (2, 8, t, 4, 4) and moments.dtype == np.float32
    mean, logvar = np.split(moments, 2, axis=1)
    assert dist.mean.std() > 0.05  # not a comparison between near-zero tensors
    np.testing.assert_allclose(mean, dist.mean.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.clip(logvar, -30, 20), dist.logvar.numpy(), rtol=0, atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("frames", [5, 9])
def test_chunked_decode_matches_diffusers_frame_for_frame(videos, frames):
    *_, want, got = videos[frames]
    assert got.shape == want.shape == (2, 3, frames, 32, 32) and got.dtype == np.float32
    assert want.std() > 0.1 and np.mean(np.abs(want) < 1) > 0.9  # mostly inside the clamp
    # frame by frame, so a shifted or reordered frame fails with its index
    for f in range(frames):
        np.testing.assert_allclose(got[:, :, f], want[:, :, f], rtol=0, atol=DECODE_ATOL,
                                   err_msg=f"frame {f}")


def _first_chunk_apart(module, x, chunk: int):
    """diffusers' chunk loop step for step, the first frame a program of its own (what the VAE
    ran before session 32): module(x[:, :1], None), then a scan over `chunk` frames at a time
    carrying the caches."""
    b, t = x.shape[:2]
    y, cache = module(x[:, :1], None)
    rest = x[:, 1:].reshape(b, (t - 1) // chunk, chunk, *x.shape[2:]).swapaxes(0, 1)

    def step(cache, piece):
        out, cache = module(piece, cache)
        return cache, out

    _, ys = jax.lax.scan(step, cache, rest)  # (n, B, t', ...)
    return jnp.concatenate([y, ys.swapaxes(0, 1).reshape(b, -1, *ys.shape[3:])], axis=1)


@pytest.mark.parametrize("half", ["encoder", "decoder"])
def test_the_first_chunk_runs_in_the_scan_as_one_copy_of_the_network(pair, videos, half):
    """Encode and decode run every chunk through one scanned network, the first one too: the
    results of the two-program form (the first chunk alone, then a scan) to float rounding,
    from half the convolutions to compile."""
    vae, _, _ = pair
    model = load_jax(vae)
    graph, state = nnx.split(model)
    encoding = half == "encoder"
    chunk = ENCODE_CHUNK if encoding else 1

    def two_programs(s, x):
        m = nnx.merge(graph, s)
        if encoding:
            h = _first_chunk_apart(m.encoder, to_channels_last(x, m.dtype), chunk)
            return to_channels_first(m.quant_conv(h)[0])
        h = m.post_quant_conv(to_channels_last(x, m.dtype))[0]
        return jnp.clip(to_channels_first(_first_chunk_apart(m.decoder, h, chunk)), -1, 1)

    def scanned(s, x):
        m = nnx.merge(graph, s)
        return m.encode_moments(x) if encoding else m.decode(x)

    x, _, moments, z, _, pixels = videos[9]  # 9 frames, 3 latent frames
    x = jnp.asarray((x if encoding else z).numpy())
    np.testing.assert_allclose(moments if encoding else pixels,
                               np.asarray(jax.jit(two_programs)(state, x)), rtol=0, atol=1e-5)
    convs = {name: jax.jit(fn).lower(state, x).as_text().count("stablehlo.convolution")
             for name, fn in (("scanned", scanned), ("two", two_programs))}
    modules = [m for _, m in getattr(model, half).iter_modules()]
    network = sum(isinstance(m, (CausalConv3d, Conv2d)) for m in modules)
    time_convs = sum(isinstance(m, Resample) and m.mode.endswith("3d") for m in modules)
    # one copy of the network and its 1x1 quant conv; before, a second copy for the first chunk,
    # less the time convs of its temporal resamplers (diffusers' first chunk skips them)
    assert time_convs == 2 and convs["scanned"] == network + 1, (convs, network)
    assert convs["two"] == 2 * network + 1 - time_convs, (convs, network)


@pytest.mark.slow
def test_encode_and_decode_are_causal(pair, videos):
    # the first 5 frames of a video give the first 2 latents of the whole video, and the first 2
    # latents decode to its first 5 frames (both shapes are compiled already, by the 5-frame case)
    _, encode, decode = pair
    x9, _, moments9, z9, _, pixels9 = videos[9]
    short = np.asarray(encode(jnp.asarray(x9[:, :, :5].numpy())))
    np.testing.assert_allclose(short, moments9[:, :, :2], rtol=0, atol=1e-6)
    head = np.asarray(decode(jnp.asarray(z9[:, :, :2].numpy())))
    np.testing.assert_allclose(head, pixels9[:, :, :5], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_released_block_layout_matches_diffusers():
    # the released VAE's 2 resnets per level (3 per decoder block) and a decoder of another
    # width: one encode and one decode
    vae = random_torch_vae(dict(TINY, num_res_blocks=2, decoder_base_dim=12))
    run = jitted(load_jax(vae), lambda m, x, z: (m.encode_moments(x), m.decode(z)))
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(1, 3, 5, 16, 16, generator=gen) * 2 - 1
    z = torch.randn(1, 4, 2, 2, 2, generator=gen)
    with torch.no_grad():
        dist, pixels = vae.encode(x).latent_dist, vae.decode(z).sample.numpy()
    moments, got = (np.asarray(a) for a in run(jnp.asarray(x.numpy()), jnp.asarray(z.numpy())))
    np.testing.assert_allclose(moments[:, :4], dist.mean.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(moments[:, 4:], dist.logvar.numpy(), rtol=0, atol=ATOL)
    assert got.shape == pixels.shape == (1, 3, 5, 16, 16) and pixels.std() > 0.1
    np.testing.assert_allclose(got, pixels, rtol=0, atol=DECODE_ATOL)


def test_frame_count_not_4k_plus_1_is_one_clear_error():
    assert [latent_frames(n) for n in (1, 5, 9, 81)] == [1, 2, 3, 21]
    cfg = WanVAEConfig.from_dict(TINY)
    assert (cfg.temporal_factor, cfg.spatial_factor) == (4, 8)
    model = abstract_module(lambda: AutoencoderKLWan(TINY, rngs=nnx.Rngs(0)))
    for frames in (0, 2, 6, 8):
        with pytest.raises(ValueError, match=f"4k\\+1 frames .*got {frames}$"):
            model.encode_moments(jnp.zeros((1, 3, frames, 32, 32)))


# ------------------------------------------------------------------ resamplers (first-chunk rule)

@pytest.mark.parametrize("mode,chunks", [("upsample3d", (1, 1, 1)), ("upsample3d", (1, 2)),
                                         ("downsample3d", (1, 4, 4)), ("downsample3d", (1, 2))])
def test_temporal_resample_chunks_match_diffusers(mode, chunks):
    torch.manual_seed(3)
    ref = torch_wan.WanResample(8, mode).eval()
    state = {f"m.{k}": v for k, v in torch_state(ref).items()}
    model = abstract_module(lambda: Resample(8, mode, rngs=nnx.Rngs(0)))
    shapes = {f"m.{k}": v for k, v in flat_shapes(model).items()}
    flat = convert_to_jax(_resample("m", "m", mode), loaders(state), shapes)
    for key, var in flat_params(model).items():
        var.set_value(jnp.asarray(flat[f"m.{key}"]))
    x = torch.randn(1, 8, sum(chunks), 6, 6)
    cache, start, want, got, jax_cache = [None], 0, [], [], None
    step = nnx.jit(lambda m, x, c: m(x, c))  # one program per chunk layout, not one per op
    for n in chunks:
        piece = x[:, :, start:start + n]
        start += n
        with torch.no_grad():
            want.append(ref(piece, feat_cache=cache, feat_idx=[0]).numpy())
        y, jax_cache = step(model, jnp.asarray(piece.numpy().transpose(0, 2, 3, 4, 1)), jax_cache)
        got.append(np.asarray(y).transpose(0, 4, 1, 2, 3))
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=0, atol=ATOL, err_msg=f"chunk {i}")
    # the first chunk keeps its frame count: upsample3d gives 1 frame, not 2; downsample3d too
    assert got[0].shape[2] == 1


def test_bf16_compute_keeps_fp32_norms_and_stays_close():
    # the Wan pipelines run this VAE in fp32; bf16 compute is possible and stays within bf16's
    # rounding (8 mantissa bits) of the fp32 result through one residual block
    from wfm_jax.models.wan.vae_layers import ResidualBlock
    blocks = [abstract_module(lambda d=d: ResidualBlock(8, 16, dtype=d, rngs=nnx.Rngs(0)))
              for d in (None, jnp.bfloat16)]  # abstract: random init costs compiles
    rng = np.random.default_rng(1)
    for key, var in flat_params(blocks[0]).items():
        value = jnp.asarray(rng.normal(size=var.shape) * 0.2 + (key.endswith("gamma")), jnp.float32)
        var.set_value(value)
        flat_params(blocks[1])[key].set_value(value)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 6, 6, 8)), jnp.float32)
    want, _ = jitted(blocks[0], lambda m, x: m(x))(x)
    got, cache = jitted(blocks[1], lambda m, x: m(x))(x.astype(jnp.bfloat16))
    assert got.dtype == jnp.bfloat16 and cache[0].dtype == jnp.bfloat16
    error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)))
    assert 0 < error < 0.05 * float(jnp.max(jnp.abs(want)))


def test_released_config_maps_every_key_and_parameter():
    # diffusers' defaults are the released Wan2.1 VAE (126.9M parameters); no memory is spent
    with torch.device("meta"):
        vae = TorchWanVAE()
    table = build_table(dict(vae.config))
    assert sorted(r.hf for r in table) == sorted(vae.state_dict())
    shapes = flat_shapes(abstract_module(lambda: AutoencoderKLWan({}, rngs=nnx.Rngs(0))))
    assert sorted(r.jax for r in table) == sorted(shapes)
    assert sum(int(np.prod(v)) for v in shapes.values()) == sum(
        p.numel() for p in vae.parameters()) == 126_892_531


def test_unsupported_configs_are_refused():
    with pytest.raises(ValueError, match="Wan2.2"):
        WanVAEConfig.from_dict(dict(TINY, is_residual=True))
    with pytest.raises(ValueError, match="attn_scales"):
        WanVAEConfig.from_dict(dict(TINY, attn_scales=[0.5]))
    with pytest.raises(ValueError, match="temperal_downsample has 2 entries"):
        WanVAEConfig.from_dict(dict(TINY, temperal_downsample=[True, True]))


def _raw(directory):
    with safe_open(os.path.join(directory, "diffusion_pytorch_model.safetensors"),
                   framework="numpy") as f:
        return {k: (f.get_slice(k).get_dtype(), f.get_tensor(k).tobytes()) for k in f.keys()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_converters_cli_round_trip(tmp_path, capsys, dtype):
    vae = random_torch_vae().to(getattr(torch, dtype))
    vae.save_pretrained(tmp_path / "src", safe_serialization=True)
    assert converters_main(["to-jax", str(tmp_path / "src"), str(tmp_path / "jax")]) == 0
    assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    assert _raw(tmp_path / "back") == _raw(tmp_path / "src")
    again = TorchWanVAE.from_pretrained(str(tmp_path / "back"), torch_dtype=getattr(torch, dtype))
    assert all(torch.equal(v, vae.state_dict()[k]) for k, v in again.state_dict().items())


def test_load_model_from_a_pipeline_dir_and_export(tmp_path):
    # the loaders trainers use: a WanPipeline-shaped dir's vae/ in, a diffusers dir out, bit-exact
    from converters.loading import export_diffusers, load_model
    vae = random_torch_vae()
    vae.save_pretrained(tmp_path / "pipe" / "vae", safe_serialization=True)
    (tmp_path / "pipe" / "model_index.json").write_text(
        '{"_class_name": "WanPipeline", "vae": ["diffusers", "AutoencoderKLWan"]}')
    model, config = load_model(str(tmp_path / "pipe"), component="vae")
    assert isinstance(model, AutoencoderKLWan) and model.config.base_dim == 8
    export_diffusers(model, config, str(tmp_path / "out"))
    assert _raw(tmp_path / "out") == _raw(tmp_path / "pipe" / "vae")


# ------------------------------------------------------------------------ latent normalisation

def test_scale_latents_matches_the_wan_pipeline_formula():
    cfg = dict(TINY, latents_mean=[0.5, -1.0, 0.25, 2.0], latents_std=[2.0, 0.5, 1.5, 3.0])
    z = np.random.default_rng(0).normal(size=(2, 4, 3, 4, 4)).astype(np.float32)
    mean = torch.tensor(cfg["latents_mean"]).view(1, 4, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg["latents_std"]).view(1, 4, 1, 1, 1)
    scaled = np.asarray(scale_latents(jnp.asarray(z), cfg))
    np.testing.assert_array_equal(scaled, ((torch.from_numpy(z) - mean) * inv_std).numpy())
    # WanPipeline's decode: latents / (1 / std) + mean (XLA's division may differ in the last bit)
    back = np.asarray(unscale_latents(jnp.asarray(scaled), cfg))
    want = (torch.from_numpy(scaled.copy()) / inv_std + mean).numpy()
    np.testing.assert_allclose(back, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(back, z, rtol=0, atol=1e-6)
