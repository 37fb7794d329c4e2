"""Converter table both ways (bit-exact round trip, strict keys), the generic loader on a
transformers save_pretrained directory, and an export that transformers loads with equal logits."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from converters.qwen3_vl import build_table, export, load_tensors, state_tensors
from converters.table import ConversionError
from tests.models.qwen3_vl._oracle import (
    IMAGE,
    VIDEO,
    flax_model,
    pixels,
    tensors_of,
    tiny_config,
    torch_model,
    visual_run,
)
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.qwen3_vl import Qwen3VLForConditionalGeneration, position_ids

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tied():
    return torch_model(seed=0)


def _abstract(config):
    from flax import nnx
    return abstract_module(lambda: Qwen3VLForConditionalGeneration(config, rngs=nnx.Rngs(0)))


def _assert_same_bytes(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_bit_exact(tie):
    tm = torch_model(tiny_config(tie_word_embeddings=tie), seed=1)
    tensors = tensors_of(tm)
    if tie:  # transformers' state_dict holds the tied head; checkpoints do not
        del tensors["lm_head.weight"]
    fm = flax_model(tm)
    assert (fm.lm_head is None) == tie
    _assert_same_bytes(state_tensors(fm), tensors)
    # the table names every parameter of the model and every key of the checkpoint
    assert {r.hf for r in build_table(tm.config.to_dict())} == set(tensors)


def test_strict_keys(tied):
    model = flax_model(tied)
    tensors = tensors_of(tied)
    missing = {k: v for k, v in tensors.items() if "blocks.1.attn.qkv.bias" not in k}
    with pytest.raises(ConversionError, match=r"missing keys: model\.visual\.blocks\.1\.attn\.qkv\.bias"):
        load_tensors(model, missing)
    with pytest.raises(ConversionError, match=r"unexpected keys: model\.visual\.extra"):
        load_tensors(model, {**tensors, "model.visual.extra": np.zeros(3, np.float32)})
    bad = dict(tensors, **{"model.visual.pos_embed.weight": np.zeros((9, 32), np.float32)})
    with pytest.raises(ConversionError, match=r"wrong shape for model\.visual\.pos_embed\.weight"):
        load_tensors(model, bad)
    differ = dict(tensors, **{"lm_head.weight": tensors["lm_head.weight"] + 1})
    with pytest.raises(ConversionError, match="tied keys"):
        load_tensors(model, differ)


def _inputs():
    grid = [[1, 4, 6]]
    ids = np.array([[1, 7, *visual_run(IMAGE, grid[0]), 8, 9, 10]])
    return ids, np.ones_like(ids), pixels(grid, seed=9), grid


def _flax_logits(model, ids, mask, pv, grid):
    pos, _ = position_ids(ids, mask, image_grid_thw=grid, image_token_id=IMAGE, video_token_id=VIDEO)
    return np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), pos, pv, np.asarray(grid))["logits"])


def _torch_logits(model, ids, mask, pv, grid):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     pixel_values=torch.tensor(pv), image_grid_thw=torch.tensor(grid),
                     mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64))).logits.numpy()


def test_generic_loader_reads_save_pretrained(tied, tmp_path):
    from converters.loading import load_model

    tied.save_pretrained(str(tmp_path))
    model, _ = load_model(str(tmp_path))
    assert isinstance(model, Qwen3VLForConditionalGeneration)
    args = _inputs()
    np.testing.assert_allclose(_flax_logits(model, *args), _torch_logits(tied, *args), atol=2e-5,
                               rtol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_export_loads_in_transformers(tie, tmp_path):
    from transformers import Qwen3VLForConditionalGeneration as Torch

    fm = flax_model(torch_model(tiny_config(tie_word_embeddings=tie), seed=2))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "tokenizer.json").write_text("{}")
    dst = str(tmp_path / "export")
    export(fm, dst, processor_dir=str(tmp_path / "base"))
    files = sorted(os.listdir(dst))
    assert files == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
    with open(os.path.join(dst, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == 2
    loaded = Torch.from_pretrained(dst, attn_implementation="eager").eval()
    assert loaded.config.tie_word_embeddings == tie
    args = _inputs()
    np.testing.assert_allclose(_torch_logits(loaded, *args), _flax_logits(fm, *args), atol=2e-5, rtol=0)
    # and back: the export converts to the same Flax weights, bit for bit
    again = flax_model(loaded)
    _assert_same_bytes(state_tensors(again), state_tensors(fm))


def test_export_bf16(tied, tmp_path):
    import ml_dtypes
    from safetensors import safe_open

    fm = flax_model(tied)
    export(fm, str(tmp_path / "bf16"), dtype=ml_dtypes.bfloat16)
    with open(tmp_path / "bf16" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "np") as f:
        assert f.get_slice("model.language_model.norm.weight").get_dtype() == "BF16"


def test_abstract_model_matches_table(tied):
    """Every parameter path of the model is a table key (eval_shape: no memory)."""
    from flax import nnx

    config = tied.config.to_dict()
    paths = {".".join(map(str, p)) for p, _ in nnx.state(_abstract(config), nnx.Param).flat_state()}
    assert paths == {r.jax for r in build_table(config)}
