"""SFT's encoding inputs: pixels travel to the device as uint8 and become [-1, 1] floats inside
the VAE encoder's jit, bit-equal to numpy's float32 formula, so the latents are the ones float32
pixels gave. On the tiny random SD3 pipeline, 8 CPU devices (fsdp), a tiny paired dataset of
random images whose 16 items share 3 prompts."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from wfm_jax.config import load_config
from wfm_jax.data.media import to_signed_unit

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
PROMPTS = ("a red circle", "two blue squares", "a green triangle")
ITEMS = 16


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.tiny import build_tiny_pipeline
    root = tmp_path_factory.mktemp("sft_encode")
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(ITEMS):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(data / f"{i}.png")
        (data / f"{i}.json").write_text(json.dumps({"prompt": PROMPTS[i % len(PROMPTS)]}))
    return build_tiny_pipeline(str(root / "pipe"), seed=0), str(data)


def config(assets, out_dir, **extra):
    pipe, data = assets
    values = {"policy.model_name_or_path": pipe, "train.train_policy.dataset.local_dir": data,
              "train.output_dir": str(out_dir), "policy.parallelism.data": 1,
              "policy.parallelism.fsdp": 8, "policy.diffusers.inference_size": "(16, 16)",
              "train.train_batch_per_replica": 8, "train.max_steps": 4, "train.log_freq": 1,
              "train.ckpt.save_freq": 100, "train.ckpt.export_safetensors": False, **extra}
    return load_config(os.path.join(CONFIGS, "tiny_sft.py"),
                       [(k, str(v)) for k, v in values.items()])


def test_uint8_to_signed_unit_on_the_device_is_numpys():
    from wfm_jax.train.encode import signed_unit
    every = np.arange(256, dtype=np.uint8)
    got = jax.jit(signed_unit)(every)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got), to_signed_unit(every))


def test_sft_sends_uint8_pixels_and_gets_the_float_latents(assets, tmp_path, monkeypatch):
    from wfm_jax.train import sft
    trainer = sft.SFTTrainer(config(assets, tmp_path / "out"))
    try:
        seen, encode = [], trainer.visual._encode

        def recording(state, pixels, key, ids):
            seen.append(pixels)
            return encode(state, pixels, key, ids)
        monkeypatch.setattr(trainer.visual, "_encode", recording)
        batch = next(trainer.loader)
        assert batch["pixels"].dtype == np.uint8
        x0, _, ids = trainer.prepare(batch)
        (sent,) = seen
        assert sent.dtype == np.uint8 and sent.shape == (8, 16, 16, 3)  # a quarter of f32's bytes
        key = jax.random.fold_in(trainer.setup.state.rng, sft._KEY_VAE)
        floats = trainer.setup.global_batch(to_signed_unit(batch["pixels"]))
        want = encode(trainer.visual.state, floats, key, ids)
        np.testing.assert_array_equal(np.asarray(x0), np.asarray(want))
    finally:
        trainer.loader.close()
        trainer.setup.close()
