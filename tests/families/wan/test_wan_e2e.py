"""Wan2.1 end to end on the tiny random pipeline (issue 12 acceptance), through `wfm_jax.cli.main`
with the tiny recipes as shipped, shortened:

- configs/tiny_wan_sft.py: the loss falls and the exported step loads in diffusers' WanPipeline
  with the trained weights;
- configs/tiny_wan_nft.py through the reference reward server on loopback, videos sent as
  media_type "video": the JPEG-compressibility reward rises and validation writes step_N.mp4;
- the same NFT with media_type "latent", the server decoding with the pipeline's Wan VAE: it runs
  and scores (no rise asked of two steps).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests._support.paths import CONFIGS
from wfm_jax.cli import main as wmain

CONFIGS = CONFIGS
TOKEN = "test-token"


def _metrics(out_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return {r["step"]: r for r in rows if "step" in r}


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("wan") / "pipe"), seed=0, family="wan")


def _server(decoder=None):
    from reward_client.background import BackgroundServer
    from reward_client.server import create_app
    return BackgroundServer(create_app(TOKEN, decoder=decoder))


def _remote(url: str, media_type: str) -> list[str]:
    from reward_client.protocol import ENQUEUE_PATH, PULL_PATH
    r = "--config.train.train_policy.remote_reward"
    return ["--config.train.train_policy.use_remote_reward=True",
            f"{r}.enqueue_url={url}{ENQUEUE_PATH}", f"{r}.fetch_url={url}{PULL_PATH}",
            f"{r}.token={TOKEN}", f"{r}.media_type={media_type}"]


def _nft(wan_dir, out_dir, steps: int, *extra) -> int:
    return wmain.main(["--config", os.path.join(CONFIGS, "tiny_wan_nft.py"),
                       f"--config.policy.model_name_or_path={wan_dir}",
                       f"--config.train.output_dir={out_dir}",
                       f"--config.train.max_steps={steps}", *extra])


@pytest.mark.slow
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_tiny_wan_sft_loss_falls_and_the_export_loads_in_diffusers(wan_dir, tmp_path):
    import torch
    from diffusers import WanPipeline

    out = tmp_path / "sft"
    rc = wmain.main(["--config", os.path.join(CONFIGS, "tiny_wan_sft.py"),
                     f"--config.policy.model_name_or_path={wan_dir}",
                     f"--config.train.train_policy.dataset.local_dir={tmp_path / 'clips'}",
                     "--config.train.train_policy.dataset.build_tiny=True",
                     f"--config.train.output_dir={out}", "--config.train.max_steps=20",
                     "--config.train.ckpt.save_freq=20"])
    assert rc == 0
    m = _metrics(out)
    assert sorted(m) == list(range(1, 21))
    loss = np.array([m[s]["train/loss"] for s in range(1, 21)])
    assert np.isfinite(loss).all()
    assert loss[-5:].mean() < loss[:5].mean(), loss
    export = out / "safetensors" / "step_20"
    pipe = WanPipeline.from_pretrained(str(export), dtype=torch.float32)
    base = WanPipeline.from_pretrained(wan_dir, dtype=torch.float32)
    trained = dict(pipe.transformer.named_parameters())
    initial = dict(base.transformer.named_parameters())
    assert trained.keys() == initial.keys()
    # the export holds the trained transformer (EMA weights moved off the initial ones)...
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)
    # ...and the frozen components as they were
    for a, b in zip(pipe.vae.parameters(), base.vae.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_tiny_wan_nft_reward_rises_through_the_server_as_video(wan_dir, tmp_path, monkeypatch):
    from wfm_jax.programs import sample as sample_lib

    methods = []  # what validation samples with: Wan's UniPC on its own timesteps, not Euler

    def recording(*args, method, timesteps, **kw):
        methods.append((method, timesteps is not None))
        return sample(*args, method=method, timesteps=timesteps, **kw)

    sample = sample_lib.sample
    monkeypatch.setattr(sample_lib, "sample", recording)
    out = tmp_path / "nft"
    with _server() as srv:
        assert _nft(wan_dir, out, 20, *_remote(srv.url, "pixels"),
                    "--config.validation.freq=20") == 0
    m = _metrics(out)
    assert sorted(m) == list(range(1, 21))
    rewards = np.array([m[s]["train/reward_mean"] for s in range(1, 21)])
    first, last = rewards[:5], rewards[-5:]
    # "clearly above": the gain exceeds 3 standard errors of the two 5-step means (measured:
    # -2.551e-3 -> -2.506e-3, 12 standard errors, seed 0, 8 devices)
    se = np.sqrt(first.var(ddof=1) / 5 + last.var(ddof=1) / 5)
    assert last.mean() - first.mean() > 3 * se, (first, last)
    assert np.isfinite(m[20]["val/reward_mean"])
    assert methods and set(methods) == {("unipc", True)}  # traced by the evaluation jit
    mp4 = out / "validation" / "step_20.mp4"
    assert mp4.is_file() and mp4.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.compile_bound  # a few steps of programs compiled once: -O0 (tests/_support/xla.py)
def test_tiny_wan_nft_scores_latents_the_server_decodes(wan_dir, tmp_path):
    from reward_client.latents import LatentDecoder

    out = tmp_path / "nft_latent"
    with _server(LatentDecoder(wan_dir)) as srv:
        assert _nft(wan_dir, out, 2, *_remote(srv.url, "latent"),
                    "--config.validation.enable=False") == 0
    m = _metrics(out)
    assert sorted(m) == [1, 2]
    assert all(np.isfinite(m[s]["train/reward_mean"]) for s in (1, 2))
