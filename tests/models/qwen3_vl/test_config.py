"""Config parsing: transformers 5 and 4.57-era layouts, one clear error per bad field, and the
written config.json read back by transformers unchanged."""
from __future__ import annotations

import copy

import pytest

from tests.models.qwen3_vl._oracle import TINY
from wfm_jax.models.qwen3_vl import Qwen3VLConfig


def test_legacy_rope_scaling_layout():
    legacy = copy.deepcopy(TINY)
    text = legacy["text_config"]
    rope = text.pop("rope_parameters")
    text["rope_theta"] = rope.pop("rope_theta")
    text["rope_scaling"] = rope
    del legacy["vision_config"]["deepstack_visual_indexes"]  # the class default (8, 16, 24)...
    legacy["vision_config"]["depth"] = 25  # ...needs blocks up to 24 and three text layers
    text["num_hidden_layers"] = 3
    cfg = Qwen3VLConfig.from_dict(legacy)
    assert cfg.text.rope_theta == 5e6
    assert cfg.text.mrope_section == (4, 2, 2)
    assert cfg.vision.deepstack_visual_indexes == (8, 16, 24)
    assert cfg.vision.rope_theta == 10000.0
    assert cfg.text_extra == {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}


@pytest.mark.parametrize(("where", "key", "value", "message"), [
    ("text_config", "rope_parameters", {"rope_type": "default", "rope_theta": 1.0,
                                        "mrope_section": [4, 3, 2]}, "does not fit head_dim"),
    ("text_config", "num_key_value_heads", 3, "not a multiple"),
    ("vision_config", "num_position_embeddings", 15, "not a square"),
    ("vision_config", "deepstack_visual_indexes", [0, 5], "outside the 2 vision blocks"),
    ("vision_config", "out_hidden_size", 32, "out_hidden_size 32 != text hidden_size 64"),
    (None, "model_type", "qwen2_5_vl", "not a Qwen3-VL config"),
])
def test_bad_fields(where, key, value, message):
    bad = copy.deepcopy(TINY)
    (bad[where] if where else bad)[key] = value
    with pytest.raises(ValueError, match=message):
        Qwen3VLConfig.from_dict(bad)


def test_written_config_reads_back_in_transformers():
    from transformers import Qwen3VLConfig as TorchConfig

    ours = Qwen3VLConfig.from_dict(TINY)
    theirs = TorchConfig(**ours.to_dict())
    assert Qwen3VLConfig.from_dict(theirs.to_dict()) == ours
    assert theirs.text_config.rope_parameters["mrope_section"] == [4, 2, 2]
    assert theirs.tie_word_embeddings
