"""`python -m wfm_jax.cli.embed`: per-prompt text embeddings of the tiny Cosmos pipeline, cached in
the WFM layout, read back through the WFM loader into the family's conditioning unchanged."""
from __future__ import annotations

import os

import numpy as np
import pytest

from wfm_jax.cli.embed import main
from wfm_jax.data.wfm import load_embedding
from wfm_jax.families import tiny
from wfm_jax.families.base import load_pipeline
from wfm_jax.families.cosmos import tiny as tiny_cosmos

MAX_LEN = 128
PROMPTS = ["a photo of the cat", "the red car on the road", "one more"]


@pytest.fixture(scope="module")
def cosmos_dir(tmp_path_factory):
    return tiny.build_tiny_pipeline(str(tmp_path_factory.mktemp("tiny_cosmos") / "pipe"),
                                    family="cosmos")


def test_embed_round_trip(cosmos_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")
    out = tmp_path / "data"
    assert main(["--model", cosmos_dir, "--prompts", str(prompts), "--out", str(out),
                 "--max-sequence-length", str(MAX_LEN), "--batch-size", "2"]) == 0
    assert "wrote 3 embedding(s)" in capsys.readouterr().out
    emb_dir = out / "text_embedding"
    assert sorted(os.listdir(emb_dir)) == ["000000.npy", "000001.npy", "000002.npy"]
    pipe = load_pipeline(cosmos_dir)
    want = np.asarray(pipe.encode_prompt(PROMPTS, MAX_LEN)["encoder_hidden_states"])
    for i in range(3):
        stored = load_embedding(str(emb_dir / f"{i:06d}.npy"))
        assert stored.shape == (MAX_LEN, tiny_cosmos.TEXT_WIDTH) and stored.dtype == np.float32
        cond = pipe.cond_from_embedding(stored)["encoder_hidden_states"]
        assert cond.shape == (1, MAX_LEN, tiny_cosmos.TEXT_WIDTH)
        np.testing.assert_allclose(cond[0], want[i], atol=1e-5, rtol=0)  # other batch

    # a WFM dataset dir: names from metas/, fp16 on request
    data = tmp_path / "wfm"
    (data / "metas").mkdir(parents=True)
    (data / "metas" / "clip_b.txt").write_text(PROMPTS[1])
    (data / "metas" / "clip_a.txt").write_text(PROMPTS[0])
    assert main(["--model", cosmos_dir, "--prompts", str(data), "--out", str(data),
                 "--max-sequence-length", str(MAX_LEN), "--dtype", "float16"]) == 0
    assert sorted(os.listdir(data / "text_embedding")) == ["clip_a.npy", "clip_b.npy"]
    b = np.load(data / "text_embedding" / "clip_b.npy")
    assert b.dtype == np.float16
    np.testing.assert_allclose(b.astype(np.float32), want[1], atol=2e-2, rtol=1e-3)


def test_embed_errors(cosmos_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main(["--model", cosmos_dir, "--prompts", str(empty), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: no prompts in {empty}"
    assert main(["--model", cosmos_dir, "--prompts", str(tmp_path), "--out",
                 str(tmp_path)]) == 2
    assert "without metas/ (not a WFM dataset)" in capsys.readouterr().err
