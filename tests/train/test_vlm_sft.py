"""The Qwen3-VL SFT loop end to end on the tiny VQA world (spec-size model, a few steps):
val/accuracy before the first and with the last step, a run stopped by SIGTERM at step 2 and
resumed logs the same metrics and ends with the same weights as an uninterrupted run, and the
export loads in transformers with the trained weights."""
from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

from tests._support.vqa import tiny_vqa_assets
from wfm_jax.config.schema import default_config
from wfm_jax.models.layers.remat import check_remat
from wfm_jax.train import preempt, vlm_sft

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    model, train, val = tiny_vqa_assets(str(root), train_count=24)
    return model, train, val


def _config(assets, out, max_steps=4, **changes):
    model, train, val = assets
    c = default_config()
    c.policy.family = "qwen3_vl"
    c.policy.model_name_or_path = model
    c.train.train_policy.dataset.layout = "conversations"
    c.train.train_policy.dataset.local_dir = train
    c.validation.dataset.local_dir = val
    c.validation.batch_size = 4
    c.train.output_dir = str(out)
    c.train.max_steps = max_steps
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 8  # divides over 8 host devices (XLA_FLAGS) or 1
    c.train.optm_lr = 1e-3
    c.train.optm_warmup_steps = 2
    c.train.ckpt.save_freq = 2
    c.train.ckpt.save_mode = "sync"
    c.policy.vlm.max_new_tokens = 4
    c.policy.vlm.pad_to_multiple = 64  # one batch shape: one compile
    for key, value in changes.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _strip_time(rec):
    return {k: v for k, v in rec.items() if k != "train/iteration_time"}


def test_stop_resume_equals_uninterrupted_and_export_loads(assets, tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import Qwen3VLForConditionalGeneration

    from converters.qwen3_vl import state_tensors

    whole = tmp_path / "whole"
    trainer = vlm_sft.VLMSFTTrainer(_config(assets, whole))
    assert trainer.run() == 4
    ref = _records(whole)
    assert [r["step"] for r in ref] == [0, 1, 2, 3, 4]
    assert "val/accuracy" in ref[0] and "val/accuracy" in ref[-1] and "val/accuracy/colour" in ref[-1]
    assert ref[-1]["train/loss"] < ref[1]["train/loss"]
    final = state_tensors(trainer.model())

    cut = tmp_path / "cut"

    def stop_at_two(step, _metrics):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with preempt.sigterm_stops_after_step(), pytest.raises(preempt.Stopped):
        vlm_sft.VLMSFTTrainer(_config(assets, cut), on_step=stop_at_two).run()
    assert sorted(os.listdir(cut / "checkpoints")) == ["2"]
    resumed = vlm_sft.VLMSFTTrainer(_config(assets, cut, **{"train.resume": True}))
    assert resumed.start_step == 2
    resumed.run()
    got = _records(cut)
    assert [_strip_time(r) for r in got] == [_strip_time(r) for r in ref]  # bit-identical values
    again = state_tensors(resumed.model())
    assert all(np.array_equal(again[k], final[k]) for k in final)

    export = whole / "safetensors" / "step_4"
    loaded = Qwen3VLForConditionalGeneration.from_pretrained(str(export))
    hf = {k: v.detach().numpy() for k, v in loaded.state_dict().items()}
    for key, value in final.items():
        np.testing.assert_array_equal(hf[key], value, err_msg=key)
    assert isinstance(loaded.model.language_model.embed_tokens.weight, torch.Tensor)


def test_lora_frozen_vision_trains_adapters_and_exports_merged(assets, tmp_path):
    from converters.qwen3_vl import state_tensors

    c = _config(assets, tmp_path / "lora", max_steps=2, **{"validation.dataset.local_dir": "",
                "policy.lora.enable": True, "policy.lora.r": 4, "policy.lora.lora_alpha": 8,
                   "policy.lora.target_modules": ("q_proj", "v_proj"), "policy.vlm.train_vision": False,
                "policy.remat": "nothing_saveable", "policy.scan_layers": True})
    trainer = vlm_sft.VLMSFTTrainer(c)
    text = trainer.model().model.language_model  # the recipe's remat and scan reached the decoder
    assert (text.remat, text.scan_layers) == (check_remat("nothing_saveable"), True)
    before = {".".join(map(str, p)) for p, _ in trainer.state.params.flat_state()}
    assert before and all(p.endswith(("lora_a", "lora_b")) for p in before)
    trainer.run()
    base = state_tensors(vlm_sft.load_base(c))
    from safetensors.numpy import load_file
    exported = load_file(str(tmp_path / "lora" / "safetensors" / "step_2" / "model.safetensors"))
    merged = vlm_sft.lora_merged(trainer.model())
    assert set(exported) == set(base)
    changed = [k for k in base if not np.array_equal(exported[k], base[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)
    assert "model.language_model.layers.0.self_attn.q_proj.kernel" in merged


def test_epochs_set_the_run_length(assets, tmp_path):
    """max_steps unset, 2 epochs: 24 conversations in batches of 8 are 3 steps an epoch, 6 in
    all, resolved before the optimizer is built and written to config.json."""
    c = _config(assets, tmp_path, max_steps=None, **{"train.epoch": 2})
    vlm_sft.VLMSFTTrainer(c).ckpt.close()
    assert c.train.max_steps == 6
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["train"]["max_steps"] == 6


def test_missing_model_dir_is_one_clear_error(assets, tmp_path):
    c = _config(assets, tmp_path / "x", **{"policy.model_name_or_path": str(tmp_path / "absent")})
    with pytest.raises(vlm_sft.VLMSetupError, match="policy.model_name_or_path: no model directory"):
        vlm_sft.VLMSFTTrainer(c)


def test_media_root_reads_images_kept_apart_from_the_annotations(assets, tmp_path):
    """policy.vlm.media_root (cosmos-rl's custom.dataset.media_path): the annotations in one
    directory, the images they name under another; without it the image paths resolve beside
    the annotations and the first example says which image it cannot read."""
    _, train, _ = assets
    ann = tmp_path / "annotations"
    ann.mkdir()
    shutil.copy(os.path.join(train, "annotations.json"), ann)
    apart = vlm_sft.VLMSFTTrainer(_config(assets, tmp_path / "apart", **{
        "train.train_policy.dataset.local_dir": str(ann), "policy.vlm.media_root": train}))
    together = vlm_sft.VLMSFTTrainer(_config(assets, tmp_path / "together"))
    assert apart.data[0].pixel_values is not None
    np.testing.assert_array_equal(apart.data[0].pixel_values, together.data[0].pixel_values)
    np.testing.assert_array_equal(apart.data[0].input_ids, together.data[0].input_ids)
    lost = vlm_sft.VLMSFTTrainer(_config(assets, tmp_path / "lost", **{
        "train.train_policy.dataset.local_dir": str(ann)}))
    with pytest.raises(ValueError, match="cannot read image .*annotations"):
        lost.data[0]


def test_tiny_base_without_pretraining_is_the_random_model(tmp_path):
    """vqa_pretrain_steps=0: the base is the random stage itself, renamed into place whole; the
    work dir goes (the pre-trained path is tests/train/test_vlm_sft_learns.py)."""
    from wfm_jax.worlds.vqa.model import ensure_base_model

    base = vlm_sft.pretrain_tiny_base(str(tmp_path / "base"), seed=3, steps=0, pictures=4)
    assert sorted(os.listdir(tmp_path)) == ["base"]
    same = ensure_base_model(str(tmp_path / "direct"), seed=3)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        with open(os.path.join(base, name), "rb") as a, open(os.path.join(same, name), "rb") as b:
            assert a.read() == b.read(), name
    assert vlm_sft.pretrain_tiny_base(base, seed=0, steps=600, pictures=4) == base  # built: kept as it is
