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

from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import load_config
from wfm_jax.data.media import to_signed_unit

CONFIGS = CONFIGS
PROMPTS = ("a red circle", "two blue squares", "a green triangle")
ITEMS = 16


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
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
    from wfm_jax.programs.encode import signed_unit
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
        key = jax.random.fold_in(trainer.setup.state.rng, sft.KEY_VAE)
        floats = trainer.setup.global_batch(to_signed_unit(batch["pixels"]))
        want = encode(trainer.visual.state, floats, key, ids)
        np.testing.assert_array_equal(np.asarray(x0), np.asarray(want))
    finally:
        trainer.loader.close()
        trainer.setup.close()


def _run(cfg, batches=None):
    """(the trainer after cfg's run, its logged metrics by step); batches: the prompts and
    pixels of each step's batch are appended to it."""
    from tests._rl_toy import metrics
    from wfm_jax.train import sft
    trainer = sft.SFTTrainer(cfg)
    if batches is not None:
        prepare = trainer.prepare

        def recording(batch):
            batches.append((list(batch["prompt"]), np.array(batch["pixels"])))
            return prepare(batch)
        trainer.prepare = recording
    assert trainer.run() == 4
    return trainer, metrics(cfg.train.output_dir)


@pytest.mark.slow  # two 4-step SFT runs end to end
def test_cached_run_equals_uncached_and_encodes_each_prompt_and_item_once(assets, tmp_path):
    from wfm_jax.train.encode_cache import item_key
    _, plain = _run(config(assets, tmp_path / "plain"))
    batches = []
    trainer, cached = _run(config(assets, tmp_path / "cached",
                                  **{"train.train_policy.cache_encodings": True}), batches)
    for step in range(1, 5):  # bit for bit
        for name in ("train/loss", "optimizer/grad_norm"):
            assert cached[step][name] == plain[step][name], (step, name)
    # 4 steps of 8 over 16 items: 2 epochs; the encoders run only on steps with a new prompt
    # or item (a batch-shaped call each), and every prompt and item is kept once
    assert len(batches) == 4
    seen_p, seen_i, text_steps, item_steps = set(), set(), 0, 0
    for prompts, pixels in batches:
        keys = {item_key(row) for row in pixels}
        text_steps += bool(set(prompts) - seen_p)
        item_steps += bool(keys - seen_i)
        seen_p |= set(prompts)
        seen_i |= keys
    cache = trainer.cache
    assert (len(cache.prompts), len(cache.items)) == (len(PROMPTS), ITEMS)
    assert item_steps == 2 and cache.posterior_calls == 2  # none in the second epoch
    assert 1 <= text_steps <= 2 and cache.text_calls == text_steps
