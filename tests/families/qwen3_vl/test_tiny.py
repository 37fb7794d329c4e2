"""The tiny Qwen3-VL directory: transformers and the project's processor load it, the VQA world's
words are single tokens, and transformers' logits equal the Flax model's on one VQA example."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from converters.loading import load_model
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor
from wfm_jax.families.qwen3_vl.tiny import SPECIAL_TOKENS, TAG_TOKENS, build_tiny_qwen3_vl
from wfm_jax.models.qwen3_vl import position_ids
from wfm_jax.worlds.vqa.dataset import sample
from wfm_jax.worlds.vqa.model import ensure_base_model
from wfm_jax.worlds.vqa.scenes import vocabulary

ATOL = 2e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_base_model(str(tmp_path_factory.mktemp("tiny") / "qwen3_vl"))


def test_files_and_tokenizer(model_dir):
    names = set(os.listdir(model_dir))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "chat_template.jinja", "preprocessor_config.json", "video_preprocessor_config.json"} <= names
    assert not [n for n in os.listdir(os.path.dirname(model_dir)) if n.startswith(".")]  # no temp left
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    proc = Qwen3VLProcessor.from_pretrained(model_dir)
    tok = proc.tokenizer
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(7))
    assert (config["image_token_id"], config["video_token_id"]) == (proc.image_token_id, proc.video_token_id)
    assert len(tok) <= config["text_config"]["vocab_size"]
    for word in vocabulary():
        assert len(tok.encode(word)) == 1 and len(tok.encode(" " + word)) == 1, word
    for tag in TAG_TOKENS:
        assert len(tok.encode(tag)) == 1
    assert tok.decode(tok.encode("zebra <answer>B</answer>")) == "zebra <answer>B</answer>"  # bytes fall back


def test_build_is_atomic_and_refuses_a_full_directory(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        build_tiny_qwen3_vl(str(target), ["red"], size="spec")
    assert os.listdir(target) == ["keep.txt"]
    with pytest.raises(ValueError, match="ASCII"):
        build_tiny_qwen3_vl(str(tmp_path / "n"), ["two words"], size="spec")
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_transformers_logits_match_flax(model_dir):
    torch = pytest.importorskip("torch")
    from transformers import Qwen3VLForConditionalGeneration

    proc = Qwen3VLProcessor.from_pretrained(model_dir)
    _, question, image = sample(0, 0, "heldout")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question.prompt}]},
                {"role": "assistant", "content": question.target}]
    inputs = proc(proc.apply_chat_template(messages, add_generation_prompt=False), images=[image])
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 6]]
    assert (inputs["input_ids"] == proc.image_token_id).sum() == 9

    tm = Qwen3VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    with torch.no_grad():
        ref = tm(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()

    fm, config = load_model(model_dir)
    pos, _ = position_ids(inputs["input_ids"], inputs["attention_mask"],
                          image_grid_thw=inputs["image_grid_thw"], image_token_id=config["image_token_id"],
                          video_token_id=config["video_token_id"])
    out = fm(jnp.asarray(inputs["input_ids"]), jnp.asarray(inputs["attention_mask"]), pos,
             inputs["pixel_values"], inputs["image_grid_thw"])
    got = np.asarray(out["logits"])
    assert got.shape == ref.shape == (1, inputs["input_ids"].shape[1], config["text_config"]["vocab_size"])
    assert np.abs(ref).max() > 1e-3  # random weights give non-trivial logits
    # atol relative to the largest logit: the VQA size's unit-RMS embeddings (tiny.INIT_STD) make
    # logits of order 10, whose fp32 rounding alone is above 2e-5 absolute
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got / scale, ref / scale, atol=ATOL, rtol=0)
