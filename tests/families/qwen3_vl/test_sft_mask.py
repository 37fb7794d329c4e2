"""The SFT loss mask on multi-turn Qwen3-VL conversations with images, against a mask built
independently: the token ids are assembled turn by turn from the tiny tokenizer, recording which
pieces are assistant content and end-of-turn, and checked to equal what the chat template plus the
processor render."""
from __future__ import annotations

import numpy as np
import pytest

from tests.families.qwen3_vl._tiny_processor import write_processor_dir
from wfm_jax.families.qwen3_vl import preprocess as pp
from wfm_jax.families.qwen3_vl.sft_mask import (
    IGNORE_INDEX,
    ChatTokens,
    assistant_mask,
    next_token_targets,
    sft_labels,
)

IMAGE_PAD = "<|image_pad|>"

# (role, [items]); an item is a string, or ("image", (h, w)) for an image of that size
CONVERSATION = [
    ("system", ["You are a helpful assistant."]),
    ("user", [("image", (64, 64)), "What is in the top-left cell? Say assistant\n please."]),
    ("assistant", ["<think>\nI see a red circle.\n</think>\n\n<answer>B</answer>"]),
    ("user", [("image", (64, 96)), ("image", (96, 64)), "And now, in these two?"]),
    ("assistant", ["<think>Two squares.</think>\n\n<answer>C</answer>"]),
    ("user", ["Thanks!"]),
    ("assistant", [""]),  # an empty answer: only its <|im_end|> counts
]


def as_messages(conversation):
    out = []
    for role, items in conversation:
        if role in ("system", "assistant") and len(items) == 1 and isinstance(items[0], str):
            out.append({"role": role, "content": items[0]})
            continue
        content = [{"type": "image"} if isinstance(it, tuple) else {"type": "text", "text": it}
                   for it in items]
        out.append({"role": role, "content": content})
    return out


def images_of(conversation, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*it[1], 3), dtype=np.uint8)
            for _, items in conversation for it in items if isinstance(it, tuple)]


def expected_ids_and_mask(tok, conversation, image_tokens):
    """Turn by turn: <|im_start|> role\\n content <|im_end|> \\n, image -> vision_start, pads, vision_end."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    ids, mask = [], []
    counts = iter(image_tokens)

    def put(piece, train):
        ids.extend(piece)
        mask.extend([train] * len(piece))

    for role, items in conversation:
        put(enc("<|im_start|>") + enc(role + "\n"), False)
        for it in items:
            if isinstance(it, tuple):
                put(enc("<|vision_start|>") + enc(IMAGE_PAD) * next(counts) + enc("<|vision_end|>"), False)
            else:
                put(enc(it), role == "assistant")
        put(enc("<|im_end|>"), role == "assistant")
        put(enc("\n"), False)
    return np.asarray(ids), np.asarray(mask)


@pytest.fixture(scope="module")
def proc(tmp_path_factory):
    return pp.Qwen3VLProcessor.from_pretrained(write_processor_dir(tmp_path_factory.mktemp("tiny_vl")))


def render(proc, conversations):
    texts = [proc.apply_chat_template(as_messages(c), add_generation_prompt=False) for c in conversations]
    images = [im for c in conversations for im in images_of(c)]
    return proc(texts, images=images)


def test_multi_turn_with_images_matches_independent_mask(proc):
    out = render(proc, [CONVERSATION])
    grids = out["image_grid_thw"]
    counts = [int(g.prod()) // 4 for g in grids]
    want_ids, want_mask = expected_ids_and_mask(proc.tokenizer, CONVERSATION, counts)
    ids = out["input_ids"][0]
    np.testing.assert_array_equal(ids, want_ids)  # the construction is what the template renders
    tokens = ChatTokens.from_tokenizer(proc.tokenizer)
    assert tokens.im_end == 2 and tokens.media == (5, 6)
    mask = assistant_mask(ids, tokens)
    np.testing.assert_array_equal(mask, want_mask)
    assert int((ids[mask] == tokens.im_end).sum()) == 3  # one end-of-turn per assistant turn
    assert not mask[out["mm_token_type_ids"][0] > 0].any() and (out["mm_token_type_ids"] > 0).sum() > 0
    labels = sft_labels(ids, mask)
    assert (labels[~want_mask] == IGNORE_INDEX).all() and (labels[want_mask] == ids[want_mask]).all()
    targets, loss_mask = next_token_targets(ids, mask)
    np.testing.assert_array_equal(targets[0], ids[1:])
    np.testing.assert_array_equal(loss_mask[0], want_mask[1:])


def test_padded_batch_and_truncation(proc):
    short = [("user", [("image", (64, 64)), "Colour?"]), ("assistant", ["<answer>A</answer>"])]
    out = render(proc, [CONVERSATION, short])  # left padded to the longer row
    tokens = ChatTokens.from_tokenizer(proc.tokenizer)
    mask = assistant_mask(out["input_ids"], tokens, out["attention_mask"])
    counts = [int(g.prod()) // 4 for g in out["image_grid_thw"]]
    for row, (conv, n_img) in enumerate(((CONVERSATION, counts[:3]), (short, counts[3:]))):
        _, want = expected_ids_and_mask(proc.tokenizer, conv, n_img)
        pad = out["input_ids"].shape[1] - want.shape[0]
        np.testing.assert_array_equal(mask[row], np.concatenate([np.zeros(pad, bool), want]))
    # truncated inside the second assistant turn: its content counts up to the cut, no end-of-turn
    ids = out["input_ids"][0][out["attention_mask"][0] > 0]
    _, want = expected_ids_and_mask(proc.tokenizer, CONVERSATION, counts[:3])
    ends = np.flatnonzero((ids == tokens.im_end) & want)
    cut = ends[1] - 3
    np.testing.assert_array_equal(assistant_mask(ids[:cut], tokens), want[:cut])
    # a generation prompt at the end (no content yet) marks nothing
    prompt = proc(proc.apply_chat_template(as_messages(short[:1]), add_generation_prompt=True),
                  images=images_of(short[:1]))["input_ids"][0]
    assert not assistant_mask(prompt, tokens).any()


def test_bad_inputs():
    tokens = ChatTokens(im_end=2, assistant_header=(1, 50, 51))
    with pytest.raises(ValueError, match="integer"):
        assistant_mask(np.zeros((2, 2, 2), np.int64), tokens)
    with pytest.raises(ValueError, match="attention_mask"):
        assistant_mask(np.zeros((2, 5), np.int64), tokens, np.ones((2, 4)))
    with pytest.raises(ValueError, match="im_end"):
        ChatTokens(im_end=2, assistant_header=(1, 2))
    assert assistant_mask(np.array([1, 50, 51, 9, 9, 2, 9]), tokens).tolist() == [0, 0, 0, 1, 1, 1, 0]
