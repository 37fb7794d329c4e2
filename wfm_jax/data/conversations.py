"""LLaVA-style JSON conversations -> Qwen3-VL SFT examples and length-bucketed batches.

Input (specs/reason2.md §4.1): a JSON list (or JSON lines) of records
    {"id": ..., "image": "a.png" | ["a.png", ...], "video": "v.mp4" | [...],
     "conversations": [{"from": "human", "value": "<image>\\nQuestion"},
                       {"from": "gpt", "value": "Answer"}, ...]}
media paths relative to the annotation file's directory (or `media_root`). As cosmos-reason2's
`create_conversation`: the first human turn holds the media (its `<image>` / `<video>` tags and the
newlines next to them are stripped; images first, then videos, then the text), later turns
alternate; an optional system prompt comes first.

Each example: the token ids of the templated, placeholder-expanded conversation (exactly what
`Qwen3VLProcessor` gives for that text), the SFT loss mask (by default cosmos-rl's: assistant content
and its `<|im_end|>`, never visual tokens, `assistant_mask`; `mask_fn` swaps the rule), the
patchified pixels and grids. `batches` groups examples of similar length (length bucketing, as no
packing is cosmos-rl's default) so that right padding stays small.
"""
from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from wfm_jax.families.qwen3_vl import sft_mask
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor, read_video
from wfm_jax.models.qwen3_vl.rope_index import position_ids

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
_MEDIA_TAG = re.compile(r"\n*</?(image|video)>\n*")
MaskFn = Callable[[np.ndarray, Any], np.ndarray]  # (token ids (L,), tokenizer) -> bool mask (L,)


def read_records(path: str) -> list[dict]:
    """A JSON list or JSON lines; a directory means its `annotations.json`."""
    if os.path.isdir(path):
        path = os.path.join(path, "annotations.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no conversation file at {path}")
    with open(path) as f:
        text = f.read()
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: neither a JSON list nor JSON lines ({e})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path}: expected a list of conversation records")
    return records


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def to_messages(record: dict, system_prompt: str | None = None) -> tuple[list[dict], list[str], list[str]]:
    """(chat messages, image paths, video paths) of one LLaVA record, paths as written in it."""
    turns = record.get("conversations")
    where = f"record {record.get('id', '?')}"
    if not isinstance(turns, list) or len(turns) < 2:
        raise ValueError(f"{where}: 'conversations' must list at least a human and a gpt turn")
    images, videos = _paths(record.get("image")), _paths(record.get("video"))
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for i, turn in enumerate(turns):
        role = ROLES.get(turn.get("from", turn.get("role")))
        value = turn.get("value", turn.get("content"))
        if role is None or not isinstance(value, str):
            raise ValueError(f"{where}: turn {i} needs 'from' (human/gpt/system) and a string 'value'")
        if i == 0 and role != "user":
            raise ValueError(f"{where}: the first turn must be the human's, got {turn.get('from')!r}")
        if role == "user" and i == 0:
            text = _MEDIA_TAG.sub("", value)
            content = [{"type": "image"}] * len(images) + [{"type": "video"}] * len(videos)
            messages.append({"role": "user", "content": [*content, {"type": "text", "text": text}]})
        else:
            messages.append({"role": role, "content": value})
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"{where}: the last turn must be the gpt's answer")
    return messages, images, videos


def assistant_mask(ids: np.ndarray, tokenizer) -> np.ndarray:
    """cosmos-rl's labels (families.qwen3_vl.sft_mask): each assistant turn's content and its
    closing `<|im_end|>`; never the system / user turns, the `<|im_start|>assistant\\n` header, the
    newline after `<|im_end|>` or visual tokens."""
    return sft_mask.assistant_mask(ids, sft_mask.ChatTokens.from_tokenizer(tokenizer))


@dataclass
class Example:
    input_ids: np.ndarray  # (L,) int64
    loss_mask: np.ndarray  # (L,) bool
    pixel_values: np.ndarray | None  # (patches, C*Tp*P*P) float32
    image_grid_thw: np.ndarray | None  # (images, 3) int64
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: np.ndarray | None = None
    record: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)


def encode(record: dict, processor: Qwen3VLProcessor, media_root: str = "", *,
           mask_fn: MaskFn = assistant_mask, system_prompt: str | None = None, max_length: int | None = None,
           images: Sequence[np.ndarray] | None = None) -> Example:
    """One record -> Example; its images read from `media_root`, or given decoded (`images`, e.g.
    from a tar shard). Longer than `max_length`: truncated at the end, unless that would cut visual
    tokens (an error: their pixels could no longer be matched)."""
    messages, image_paths, video_paths = to_messages(record, system_prompt)
    if images is not None:
        if len(images) != len(image_paths):
            raise ValueError(f"record {record.get('id', '?')} names {len(image_paths)} images, "
                             f"{len(images)} were given")
        image_paths = []
    images = list(images or [])
    for p in image_paths:
        path = os.path.join(media_root, p)
        try:
            with Image.open(path) as im:
                images.append(np.asarray(im.convert("RGB")))
        except (OSError, ValueError) as e:
            raise ValueError(f"record {record.get('id', '?')}: cannot read image {path}: {e}") from None
    videos = [read_video(os.path.join(media_root, p)) for p in video_paths]
    text = processor.apply_chat_template(messages, add_generation_prompt=False)
    out = processor(text, images=images or None, videos=videos or None, padding_side="right")
    ids = out["input_ids"][0]
    mask = np.asarray(mask_fn(ids, processor.tokenizer), bool)
    if mask.shape != ids.shape:
        raise ValueError(f"mask_fn returned shape {mask.shape} for {ids.shape} token ids")
    mask &= out["mm_token_type_ids"][0] == 0  # visual tokens never carry loss
    if max_length is not None and len(ids) > max_length:
        if out["mm_token_type_ids"][0][max_length:].any():
            raise ValueError(f"record {record.get('id', '?')}: {len(ids)} tokens; truncating to "
                             f"{max_length} would cut visual tokens")
        ids, mask = ids[:max_length], mask[:max_length]
    return Example(ids, mask, out.get("pixel_values"), out.get("image_grid_thw"),
                   out.get("pixel_values_videos"), out.get("video_grid_thw"), record)


def bucket_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int = 0,
                   window: int = 64, pad_to_multiple: int = 1) -> list[list[int]]:
    """Index batches for one epoch: shuffle (seed, epoch), sort each window of `window` batches'
    worth of examples by their length padded up to `pad_to_multiple` (collate's shapes), cut
    into batches, shuffle the batch order. Examples of one padded length keep their shuffled
    order: sorting them further buys no padding and, where length follows the kind of example
    (a question type), would make every batch one kind. Every index appears once; the last batch
    may be short."""
    if batch_size < 1 or window < 1 or pad_to_multiple < 1:
        raise ValueError(f"batch_size, window and pad_to_multiple must be >= 1, got {batch_size}, "
                         f"{window}, {pad_to_multiple}")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        # a stable sort: ties stay in the shuffled order
        chunk = sorted(order[start:start + span].tolist(), key=lambda i: -(-lengths[i] // pad_to_multiple))
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    return [batches[int(i)] for i in rng.permutation(len(batches))]


def collate(examples: Sequence[Example], pad_id: int, image_token_id: int, video_token_id: int,
            pad_to_multiple: int = 8) -> dict[str, np.ndarray]:
    """Right-padded arrays (B, L), L the longest rounded up to `pad_to_multiple` (fewer distinct
    shapes to compile), pixels concatenated in batch order, and the M-RoPE position ids (4, B, L)."""
    longest = max(len(e) for e in examples)
    length = -(-longest // pad_to_multiple) * pad_to_multiple
    b = len(examples)
    ids = np.full((b, length), pad_id, np.int64)
    attention, loss = np.zeros((b, length), np.int64), np.zeros((b, length), bool)
    for i, e in enumerate(examples):
        ids[i, :len(e)], attention[i, :len(e)], loss[i, :len(e)] = e.input_ids, 1, e.loss_mask
    types = np.where(ids == image_token_id, 1, np.where(ids == video_token_id, 2, 0)) * attention
    out = {"input_ids": ids, "attention_mask": attention, "loss_mask": loss, "mm_token_type_ids": types}
    for key, grid_key in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        parts = [(getattr(e, key), getattr(e, grid_key)) for e in examples if getattr(e, key) is not None]
        if parts:
            out[key] = np.concatenate([p for p, _ in parts])
            out[grid_key] = np.concatenate([g for _, g in parts])
    out["position_ids"], _ = position_ids(ids, attention, image_grid_thw=out.get("image_grid_thw"),
                                          video_grid_thw=out.get("video_grid_thw"),
                                          image_token_id=image_token_id, video_token_id=video_token_id)
    return out


class ConversationDataset:
    """The records of one annotation file, encoded on first use (cached: small SFT sets)."""

    def __init__(self, path: str | None, processor: Qwen3VLProcessor, *, media_root: str | None = None,
                 mask_fn: MaskFn = assistant_mask, system_prompt: str | None = None,
                 max_length: int | None = None, records: list[dict] | None = None,
                 images: list[list[np.ndarray]] | None = None):
        self.records = read_records(path) if records is None else records
        if not self.records:
            raise ValueError(f"{path}: no conversation records")
        base = "" if path is None else path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        self.media_root = media_root or base
        self.processor = processor
        self.options = dict(mask_fn=mask_fn, system_prompt=system_prompt, max_length=max_length)
        self._images = images  # decoded per record (WebDataset), else read from media_root
        self._cache: dict[int, Example] = {}

    @classmethod
    def from_webdataset(cls, location: str, processor: Qwen3VLProcessor, *, s3_config=None,
                        **options) -> ConversationDataset:
        """Tar shards (a local directory or s3://bucket/prefix, as data.webdataset resolves them),
        each sample `X.json` (one LLaVA record) + `X.png|jpg|...` (its image): read once, kept
        in memory (SFT sets for this model are small)."""
        from wfm_jax.data import media
        from wfm_jax.data.tar_stream import TarShardIterator
        from wfm_jax.data.webdataset import resolve_shards

        shards = resolve_shards(location, (), s3_config)
        records, images = [], []
        for path in shards.paths:
            for sample in TarShardIterator(shards.url(path), shards.cfg):
                where = f"shard {sample['__url__']} sample '{sample['__key__']}'"
                if "json" not in sample:
                    raise ValueError(f"{where}: no .json conversation record")
                found = sorted(e for e in sample if "." + e in media.IMAGE_EXTS)
                if len(found) != 1:
                    raise ValueError(f"{where}: expected one image (.jpg|.jpeg|.png|.webp), got {found}")
                with Image.open(io.BytesIO(sample[found[0]])) as im:
                    images.append([np.asarray(im.convert("RGB"))])
                records.append(json.loads(sample["json"]))
        return cls(None, processor, records=records, images=images, **options)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Example:
        if i not in self._cache:
            images = None if self._images is None else self._images[i]
            self._cache[i] = encode(self.records[i], self.processor, self.media_root, images=images,
                                    **self.options)
        return self._cache[i]

    def lengths(self) -> list[int]:
        return [len(self[i]) for i in range(len(self))]

    def batches(self, batch_size: int, *, seed: int = 0, epoch: int = 0, window: int = 64,
                pad_to_multiple: int = 8) -> Iterator[dict[str, np.ndarray]]:
        """One epoch of length-bucketed, collated batches, deterministic in (seed, epoch)."""
        tok = self.processor.tokenizer
        for idx in bucket_batches(self.lengths(), batch_size, seed, epoch, window, pad_to_multiple):
            yield collate([self[i] for i in idx], tok.pad_token_id, self.processor.image_token_id,
                          self.processor.video_token_id, pad_to_multiple)
