"""media_type "latent": the reference server decodes Wan2.1 latents with the Flax VAE of a
pipeline dir and scores them as the video diffusers' WanPipeline would decode; without a
pipeline a latent payload is a clear 422; RewardComputer's media_type config key."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import requests
import torch

from reward_client.background import BackgroundServer
from reward_client.computer import RewardComputer
from reward_client.errors import RewardConfigError, RewardProtocolError, RewardServiceError
from reward_client.latents import LatentDecoder
from reward_client.protocol import ENQUEUE_PATH, build_header, check_media, decode_enqueue, encode_enqueue
from reward_client.registry import register_reward, unregister_reward
from reward_client.server import create_app
from reward_client.server import main as server_main
from tests.reward_client.test_reward_server import TOKEN, fast_config
from wfm_jax.config.recipe import ConfigError, from_tree, validate
from wfm_jax.train.reward_media import reward_media
from wfm_jax.train.rl_setup import reward_config

# The spec's tiny Wan VAE (video_models.md §4.2) with non-trivial latent statistics, so the
# de-normalisation before decode is exercised.
TINY = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
            temperal_downsample=[False, True, True], latents_mean=[0.3, -0.5, 0.1, 0.8],
            latents_std=[1.5, 0.7, 2.0, 1.1])
FNS = [{"name": "t_mean_pixel", "weight": 1.0}, {"name": "jpeg_compressibility", "weight": 0.5}]


@pytest.fixture(scope="module")
def mean_pixel_reward():
    @register_reward("t_mean_pixel")
    def mean_pixel(images, prompts, extras):  # exact on uint8: any decode difference shows
        return np.asarray(images, np.float64).mean(axis=(1, 2, 3)) / 255.0
    yield
    unregister_reward("t_mean_pixel")


@pytest.fixture(scope="module")
def torch_vae():
    from diffusers import AutoencoderKLWan
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**TINY).eval()
    with torch.no_grad():  # norm gains off 1, so a wrongly mapped gamma shows
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return vae


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory, torch_vae):
    root = tmp_path_factory.mktemp("wan_pipe")
    torch_vae.save_pretrained(root / "vae")
    (root / "model_index.json").write_text(json.dumps(
        {"_class_name": "WanPipeline", "vae": ["diffusers", "AutoencoderKLWan"]}))
    return str(root)


@pytest.fixture(scope="module")
def latents():
    """What a Wan trainer sends: normalised latents (B, z_dim, T, h, w) as float16."""
    return np.random.default_rng(0).standard_normal((2, 4, 2, 4, 4)).astype(np.float16)


def diffusers_video(vae, latents: np.ndarray) -> np.ndarray:
    """WanPipeline's decode of normalised latents, then uint8 [B, C, T, H, W] (rounded)."""
    z = torch.from_numpy(latents.astype(np.float32))
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(z / std + mean, return_dict=False)[0]
    pixels = (video / 2 + 0.5).clamp(0, 1).numpy()
    return np.round(pixels * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def decoder(pipeline_dir):
    return LatentDecoder(pipeline_dir)


@pytest.fixture(scope="module")
def server(decoder, mean_pixel_reward):
    with BackgroundServer(create_app(TOKEN, decoder=decoder)) as srv:
        yield srv


def test_decoder_matches_diffusers_wan_pipeline(decoder, torch_vae, latents):
    got, want = decoder(latents), diffusers_video(torch_vae, latents)
    assert got.shape == want.shape == (2, 3, 5, 32, 32) and got.dtype == np.uint8
    assert want.std() > 10  # a real picture, not a flat clamp
    # fp32 parity (1e-4) leaves at most a rounding step between the uint8 videos
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert np.mean(got == want) > 0.99


def test_latents_score_as_the_diffusers_decoded_video(server, torch_vae, latents):
    prompts = ["a cat", "a dog"]
    video = diffusers_video(torch_vae, latents)
    with RewardComputer(FNS, remote=fast_config(server.url), media_type="latent") as rc:
        by_latent = rc.score(latents, prompts, media_type="latent")
        by_video = rc.score(video, prompts)  # media_type "video" [B,C,T,H,W]
    assert by_latent.keep.all() and by_video.keep.all()
    # local rewards score a video as the mean over up to 4 evenly spaced frames: 0, 1, 3, 4 of 5
    by_hand = video[:, :, [0, 1, 3, 4]].astype(np.float64).mean(axis=(1, 2, 3, 4)) / 255
    np.testing.assert_allclose(by_video.per_fn["t_mean_pixel"], by_hand, rtol=1e-12)
    # one uint8 step on <1% of pixels: mean-pixel scores agree to well under 1/255
    np.testing.assert_allclose(by_latent.per_fn["t_mean_pixel"], by_video.per_fn["t_mean_pixel"],
                               rtol=0, atol=2e-4)
    np.testing.assert_allclose(by_latent.per_fn["jpeg_compressibility"],
                               by_video.per_fn["jpeg_compressibility"], rtol=0.02)
    assert not np.allclose(by_latent.per_fn["t_mean_pixel"][0], by_latent.per_fn["t_mean_pixel"][1])


def test_latent_payload_is_refused_without_a_pipeline(mean_pixel_reward, latents):
    with BackgroundServer(create_app(TOKEN)) as plain:
        with RewardComputer(FNS, remote=fast_config(plain.url), media_type="latent") as rc:
            with pytest.raises(RewardServiceError, match="no VAE to decode latents.*--pipeline"):
                rc.score(latents, ["a", "b"], media_type="latent")


def test_latents_the_vae_cannot_decode_are_422(server):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    wrong = np.zeros((1, 6, 2, 4, 4), np.float16)  # 6 channels, the VAE has 4
    body = encode_enqueue(build_header(["p"], {"t_mean_pixel": 1.0}, "latent"), wrong)
    resp = requests.post(server.url + ENQUEUE_PATH, data=body, headers=auth, timeout=10)
    assert resp.status_code == 422 and "[B,4,T,H,W]" in resp.json()["detail"]


def test_latent_media_checks():
    check_media(np.zeros((1, 4, 2, 4, 4), np.float16), "latent")
    for bad in (np.zeros((1, 4, 2, 4, 4), np.uint8), np.zeros((1, 4, 4, 4), np.float32)):
        with pytest.raises(RewardProtocolError, match=r"float VAE latents \[B,C,T,H,W\]"):
            check_media(bad, "latent")


def test_bfloat16_latents_as_cosmos_rl_clients_send_them(latents):
    """torch.save of a bfloat16 tensor (cosmos-rl's video client) and bfloat16 bytes as uint8
    (what cosmos-rl's service reads a uint8 latent payload as) both arrive as float32 latents."""
    import io

    import ml_dtypes
    want = latents.astype(ml_dtypes.bfloat16).astype(np.float32)
    header = build_header(["a", "b"], {"t_mean_pixel": 1.0}, "latent")
    head = json.dumps(header).encode() + b"\n"
    buf = io.BytesIO()
    torch.save(torch.from_numpy(latents.astype(np.float32)).to(torch.bfloat16), buf)
    as_bytes = latents.astype(ml_dtypes.bfloat16).view(np.uint8)
    for body in (head + buf.getvalue(), encode_enqueue(header, as_bytes)):
        _, media = decode_enqueue(body)
        assert media.dtype == np.float32 and media.shape == latents.shape
        np.testing.assert_array_equal(media, want)
    with pytest.raises(RewardProtocolError, match="not bfloat16 bytes"):
        decode_enqueue(encode_enqueue(header, np.zeros((2, 4, 2, 4, 3), np.uint8)))


def test_media_type_config_key():
    remote = {"enqueue_url": "http://127.0.0.1:1/api/reward/enqueue",
              "fetch_url": "http://127.0.0.1:1/api/reward/pull"}
    rc = RewardComputer.from_config({"reward_fns": [{"name": "x"}], "media_type": "latent",
                                     "remote": remote})
    assert rc.media_type == "latent"
    rc.close()
    with pytest.raises(RewardConfigError, match="'jpeg_compressibility'.*run locally on pixels"):
        RewardComputer.from_config({"reward_fns": [{"name": "jpeg_compressibility", "local": True}],
                                    "media_type": "latent"})
    with pytest.raises(RewardConfigError, match="media_type='video'.*pixels"):
        RewardComputer([{"name": "jpeg_compressibility"}], media_type="video")
    assert RewardComputer([{"name": "jpeg_compressibility"}]).media_type == "pixels"


def test_server_command_line_without_a_vae(tmp_path, capsys):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    assert server_main(["--token", "t", "--pipeline", str(tmp_path)]) == 2
    assert "cannot load a VAE" in capsys.readouterr().err


def test_trainer_reward_media():
    images = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    media, kind = reward_media("pixels", images)
    assert kind == "image" and media is not None and np.array_equal(media, images)
    video = np.arange(2 * 5 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 5, 4, 4, 3)
    media, kind = reward_media("pixels", video)
    assert kind == "video" and media.shape == (2, 3, 5, 4, 4)
    assert media[1, 2, 3, 1, 0] == video[1, 3, 1, 0, 2]  # [B,T,H,W,C] -> [B,C,T,H,W]
    latents = np.linspace(-3, 3, 2 * 4 * 2 * 4 * 4, dtype=np.float32).reshape(2, 4, 2, 4, 4)
    media, kind = reward_media("latent", video, latents)
    assert kind == "latent" and media.dtype == np.float16  # cosmos-rl's payload dtype
    np.testing.assert_array_equal(media, latents.astype(np.float16))
    check_media(media, kind)
    with pytest.raises(ValueError, match="uint8"):
        reward_media("pixels", images.astype(np.float32))


def test_remote_reward_media_type_config_key():
    rr = "train.train_policy.remote_reward"
    assert reward_config(validate(from_tree({})))["media_type"] == "pixels"
    config = validate(from_tree({f"{rr}.media_type": "latent",
                                 "train.train_policy.use_remote_reward": True}))
    assert reward_config(config)["media_type"] == "latent"
    with pytest.raises(ConfigError, match="media_type.*'video'.*pixels"):
        validate(from_tree({f"{rr}.media_type": "video"}))


class _StubRun:
    """What rl.rollout_batch reads of a run, around a fixed 'rollout' of a video model: each
    chunk's final latents and the (unused in latent mode) pixels."""

    def __init__(self, rewards, latents):
        self.rewards, self.rollout_chunk, self._latents = rewards, 1, latents
        self.algo = type("Algo", (), {"final_latents": staticmethod(lambda f: f["x0"])})()

    def rollout_conditions(self, rows):
        # one conditioning per chunk of 1; nothing kept once per step (the layout has no slots)
        return [{"e": np.zeros((1, 1), np.float32)} for _ in rows], {}

    def initial_latents(self, key, n):
        return None

    def chunk_inputs(self, batch, lo, hi):
        return {"row": lo}

    def rollout(self, state, latents, cond, key, inputs):
        x0 = self._latents[inputs["row"]:inputs["row"] + 1].astype(np.float32)
        return {"x0": x0}, np.zeros((1, 5, 32, 32, 3), np.uint8)


def test_rl_rollout_sends_latents_in_latent_mode(server, latents):
    from wfm_jax.train.metrics import Timers
    from wfm_jax.train.rl import rollout_batch
    prompts = ["a cat", "a dog"]
    batch = {"prompt": prompts, "metadata": [{}, {}], "group": np.array([0, 1])}
    with RewardComputer(FNS, remote=fast_config(server.url), media_type="latent") as rc:
        out = rollout_batch(_StubRun(rc, latents), None, batch, jax.random.key(0), Timers())
        want = rc.score(latents, prompts, media_type="latent")
    # the latents were scored, not the zero pixels (decoded in chunks of 1 vs a batch of 2: fp32 noise)
    np.testing.assert_allclose(out["reward"], want.total, rtol=1e-5)
    assert out["per_fn"]["t_mean_pixel"].min() > 0.05
