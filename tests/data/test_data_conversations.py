"""LLaVA conversations -> Qwen3-VL SFT examples: ids equal the processor's on the hand-written
template text, the loss mask equals an independent character-span mask (assistant content and
<|im_end|> only), and length-bucketed batches keep padding bounded."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from wfm_jax.data.conversations import ConversationDataset, bucket_batches, encode, read_records, to_messages
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor
from wfm_jax.families.qwen3_vl.tiny import write_processor_files
from wfm_jax.models.qwen3_vl import position_ids
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset
from wfm_jax.worlds.vqa.scenes import vocabulary

IMAGE_BLOCK = "<|vision_start|>" + "<|image_pad|>" * 9 + "<|vision_end|>"  # a 96x96 picture


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    d = tmp_path_factory.mktemp("proc")
    write_processor_files(str(d), vocabulary())
    return Qwen3VLProcessor.from_pretrained(str(d))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(d / name)
    return d


def _char_mask(pieces):
    """Independent reference: (text, per-character loss flag) from (piece, counts) pairs."""
    text = "".join(p for p, _ in pieces)
    flags = np.concatenate([np.full(len(p), c, bool) for p, c in pieces])
    return text, flags


def _token_mask(tokenizer, text, flags):
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = np.array([bool(flags[a:b].all()) and b > a for a, b in enc["offset_mapping"]])
    return np.asarray(enc["input_ids"]), mask


def test_multi_turn_ids_and_mask(processor, media):
    record = {"id": "x", "image": ["a.png", "b.png"], "conversations": [
        {"from": "human", "value": "<image>\n<image>\nWhat colour is the shape?"},
        {"from": "gpt", "value": "<think>\nI look.\n</think>\n\n<answer>B</answer>"},
        {"from": "human", "value": "How many red shapes are there?"},
        {"from": "gpt", "value": "<answer>2</answer>"}]}
    ex = encode(record, processor, str(media), system_prompt="You are helpful.")
    text, flags = _char_mask([
        ("<|im_start|>system\nYou are helpful.<|im_end|>\n", False),
        ("<|im_start|>user\n" + IMAGE_BLOCK * 2 + "What colour is the shape?<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        ("<think>\nI look.\n</think>\n\n<answer>B</answer><|im_end|>", True), ("\n", False),
        ("<|im_start|>user\nHow many red shapes are there?<|im_end|>\n<|im_start|>assistant\n", False),
        ("<answer>2</answer><|im_end|>", True), ("\n", False)])
    ids, mask = _token_mask(processor.tokenizer, text, flags)
    direct = processor(text.replace(IMAGE_BLOCK, "<|vision_start|><|image_pad|><|vision_end|>"),
                       images=[np.asarray(Image.open(media / n)) for n in ("a.png", "b.png")])
    np.testing.assert_array_equal(ex.input_ids, direct["input_ids"][0])
    np.testing.assert_array_equal(ex.input_ids, ids)
    np.testing.assert_array_equal(ex.loss_mask, mask)
    np.testing.assert_array_equal(ex.pixel_values, direct["pixel_values"])
    assert ex.image_grid_thw.tolist() == [[1, 6, 6], [1, 6, 6]]
    answers = ("<think>\nI look.\n</think>\n\n<answer>B</answer>", "<answer>2</answer>")
    assert ex.loss_mask.sum() == sum(len(processor.tokenizer.encode(a)) + 1 for a in answers)


def test_media_tags_stripped_and_bad_records(processor, media):
    messages, images, videos = to_messages({"image": "a.png", "conversations": [
        {"from": "human", "value": "Look: <image>\nWhat?"}, {"from": "gpt", "value": "A"}]})
    assert messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "Look: What?"}]
    assert (images, videos) == (["a.png"], [])
    with pytest.raises(ValueError, match="last turn"):
        to_messages({"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]})
    with pytest.raises(ValueError, match="first turn"):
        to_messages({"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}]})
    with pytest.raises(ValueError, match="cannot read image"):
        encode({"id": "m", "image": "missing.png", "conversations": [
            {"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]}, processor, str(media))
    with pytest.raises(ValueError, match="mask_fn returned shape"):
        encode({"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nq"},
                                                    {"from": "gpt", "value": "a"}]}, processor, str(media),
               mask_fn=lambda ids, tok: np.zeros(len(ids) + 1, bool))


def test_read_records_json_lines(tmp_path):
    rows = [{"id": i, "conversations": []} for i in range(3)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_records(str(tmp_path / "a.jsonl")) == rows
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON lines"):
        read_records(str(tmp_path / "b.json"))


def test_bucketing_covers_every_index_once_and_bounds_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 400, size=1000).tolist()
    batches = bucket_batches(lengths, 8, seed=1, window=16)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches == bucket_batches(lengths, 8, seed=1, window=16)
    assert batches != bucket_batches(lengths, 8, seed=1, epoch=1, window=16)

    def padding(bs):
        total = sum(max(lengths[i] for i in b) * len(b) for b in bs)
        return 1 - sum(lengths) / total
    unbucketed = padding(bucket_batches(lengths, 8, seed=1, window=1))
    assert padding(batches) < 0.05 < 0.25 < unbucketed


def test_bucketing_mixes_examples_of_one_padded_length():
    """Rows that pad to one shape are not sorted further: two kinds of example whose lengths
    differ by less than the multiple (as the tiny VQA world's question types do) share batches,
    while lengths a multiple apart still bucket apart."""
    kinds = np.arange(512) % 2  # kind 0: 70 tokens, kind 1: 75; both pad to 80
    lengths = (70 + 5 * kinds).tolist()
    sorted_by_length = bucket_batches(lengths, 16, seed=3)
    padded = bucket_batches(lengths, 16, seed=3, pad_to_multiple=80)
    assert sorted(i for b in padded for i in b) == list(range(512))
    assert all(len({kinds[i] for i in b}) == 1 for b in sorted_by_length)  # one kind per batch
    assert sum(len({kinds[i] for i in b}) == 2 for b in padded) >= 30  # nearly all mixed
    # a third kind 100 tokens long pads to 160: never in a batch with the others
    lengths3 = lengths + [150] * 256
    for b in bucket_batches(lengths3, 16, seed=3, pad_to_multiple=80):
        assert len({lengths3[i] > 100 for i in b}) == 1


def test_dataset_batches(processor, tmp_path):
    directory = build_vqa_dataset(str(tmp_path / "vqa"), count=24, split="train", seed=0)
    ds = ConversationDataset(directory, processor)
    seen = 0
    for batch in ds.batches(6, seed=0):
        b, length = batch["input_ids"].shape
        assert length % 8 == 0 and length - batch["attention_mask"].sum(1).max() < 8
        assert batch["pixel_values"].shape == (36 * b, 1536) and batch["image_grid_thw"].shape == (b, 3)
        assert not (batch["loss_mask"] & (batch["attention_mask"] == 0)).any()
        assert not (batch["loss_mask"] & (batch["mm_token_type_ids"] != 0)).any()
        pos, _ = position_ids(batch["input_ids"], batch["attention_mask"],
                              image_grid_thw=batch["image_grid_thw"], image_token_id=processor.image_token_id,
                              video_token_id=processor.video_token_id)
        np.testing.assert_array_equal(batch["position_ids"], pos)
        for row, ex_ids in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            assert (row[ex_ids == 0] == processor.tokenizer.pad_token_id).all()
        seen += b
    assert seen == 24
    ends = ds[0].input_ids[ds[0].loss_mask][-1]
    assert ends == processor.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_video_record(processor, tmp_path):
    from wfm_jax.families.qwen3_vl.preprocess import read_video
    from wfm_jax.io.media import write_mp4

    frames = np.random.default_rng(1).integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
    write_mp4(str(tmp_path / "v.mp4"), frames)
    record = {"video": "v.mp4", "conversations": [{"from": "human", "value": "<video>\nWhat?"},
                                                  {"from": "gpt", "value": "red"}]}
    ex = encode(record, processor, str(tmp_path))
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                {"role": "assistant", "content": "red"}]
    direct = processor(processor.apply_chat_template(messages, add_generation_prompt=False),
                       videos=[read_video(tmp_path / "v.mp4")])
    np.testing.assert_array_equal(ex.input_ids, direct["input_ids"][0])
    np.testing.assert_array_equal(ex.pixel_values_videos, direct["pixel_values_videos"])
    assert ex.pixel_values is None and (ex.input_ids == processor.video_token_id).sum() > 0
    red = processor.tokenizer.encode("red") + processor.tokenizer.encode("<|im_end|>")
    assert ex.input_ids[ex.loss_mask].tolist() == red


def test_webdataset_shards_give_the_same_examples(processor, tmp_path):
    import io
    import tarfile

    directory = build_vqa_dataset(str(tmp_path / "vqa"), count=6, split="heldout", seed=1)
    local = ConversationDataset(directory, processor)
    (tmp_path / "shards").mkdir()
    for shard in range(2):  # records 0-2 in shard 0, 3-5 in shard 1
        with tarfile.open(tmp_path / "shards" / f"{shard:03d}.tar", "w") as tar:
            for i in range(3 * shard, 3 * shard + 3):
                rec = local.records[i]
                png = (tmp_path / "vqa" / rec["image"]).read_bytes()
                for ext, data in (("json", json.dumps(rec).encode()), ("png", png)):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    shards = ConversationDataset.from_webdataset(str(tmp_path / "shards"), processor)
    assert len(shards) == 6
    for i in range(6):
        np.testing.assert_array_equal(shards[i].input_ids, local[i].input_ids)
        np.testing.assert_array_equal(shards[i].loss_mask, local[i].loss_mask)
        np.testing.assert_array_equal(shards[i].pixel_values, local[i].pixel_values)
