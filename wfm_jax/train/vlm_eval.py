"""Held-out accuracy of a vision-language model on multiple-choice conversations: the question
turn (media + text) as the prompt, greedy generation with the KV cache, the answer scored by
cosmos-rl's single-choice rule (worlds/vqa/score.py) against each record's `answer` letter."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from PIL import Image

from wfm_jax.core.mesh import mesh_size_for
from wfm_jax.data.conversations import to_messages
from wfm_jax.models.qwen3_vl.generate import generate
from wfm_jax.worlds.vqa.score import accuracy


def read_images(records: Sequence[dict], media_root: str) -> list[list[np.ndarray]]:
    out = []
    for rec in records:
        paths = rec.get("image") or []
        paths = [paths] if isinstance(paths, str) else paths
        images = []
        for p in paths:
            with Image.open(os.path.join(media_root, p)) as im:
                images.append(np.asarray(im.convert("RGB")))
        out.append(images)
    return out


def end_tokens(config) -> tuple[list[int], int]:
    """(end ids, pad id) of the text config (generation stops at <|im_end|>)."""
    extra = config.text_extra
    eos = [int(e) for e in np.atleast_1d(extra.get("eos_token_id", []))]
    pad = extra.get("pad_token_id")
    return eos, int(eos[0] if pad is None and eos else pad or 0)


def answers(model, processor, records: Sequence[dict], images: Sequence[Sequence[np.ndarray]], *,
            max_new_tokens: int, batch_size: int, system_prompt: str | None = None, mesh=None,
            prefixes: Sequence[str] | None = None) -> list[str]:
    """Greedy completions of each record's first turn (its answer turns left out). mesh: the
    mesh the model lives on; each batch's rows are split over its batch axes, a short last batch
    padded with copies of its last record (their answers dropped). prefixes: a forced start of
    each record's answer (after the generation prompt), returned as part of the answer."""
    eos, pad = end_tokens(model.config)
    shards = 1 if mesh is None else mesh_size_for(mesh, "act_batch")
    out: list[str] = []
    for start in range(0, len(records), batch_size):
        chunk = list(range(start, min(start + batch_size, len(records))))
        real = len(chunk)
        chunk += [chunk[-1]] * (-real % shards)
        texts = []
        for i in chunk:
            messages, _, _ = to_messages(records[i], system_prompt)
            prompt = messages[:-1] if messages[-1]["role"] == "assistant" else messages
            first_user = next(k for k, m in enumerate(prompt) if m["role"] == "user")
            texts.append(processor.apply_chat_template(prompt[:first_user + 1], add_generation_prompt=True)
                         + (prefixes[i] if prefixes is not None else ""))
        flat = [im for i in chunk for im in images[i]]
        batch = processor(texts, images=flat or None, padding_side="left")
        ids = generate(model, batch["input_ids"], batch["attention_mask"],
                       pixel_values=batch.get("pixel_values"), image_grid_thw=batch.get("image_grid_thw"),
                       max_new_tokens=max_new_tokens, eos_token_ids=eos, pad_token_id=pad, mesh=mesh)
        for i, row in zip(chunk[:real], np.asarray(ids)[:real]):
            ends = np.flatnonzero(np.isin(row, eos))
            row = row[:ends[0]] if len(ends) else row
            start_text = prefixes[i] if prefixes is not None else ""
            out.append(start_text + processor.tokenizer.decode(row.tolist(), skip_special_tokens=True))
    return out


def val_metrics(model, processor, records, images, **kwargs) -> dict[str, float]:
    """{"val/accuracy": overall, "val/accuracy/<question_type>": per type}."""
    texts = answers(model, processor, records, images, **kwargs)
    return {f"val/{k}": v for k, v in accuracy(records, texts).items()}
