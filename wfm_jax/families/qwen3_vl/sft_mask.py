"""SFT loss mask for Qwen3-VL conversations, as cosmos-rl's Qwen3-VL data packer labels them
(shared/specs/reason2.md 4.1; cosmos_rl/dispatcher/data/packer/qwen3_vl_data_packer.py
`_process_single_sample`): only the content tokens of assistant turns and the `<|im_end|>` right
after each of them count; system and user turns, the `<|im_start|>assistant\\n` header, the `\\n`
after `<|im_end|>`, padding and image/video placeholder tokens do not.

Input: token ids of a conversation rendered with the Qwen3-VL chat template (images/videos already
expanded to their `<|image_pad|>` / `<|video_pad|>` runs), one row [L] or a batch [B, L] (left or
right padded). The mask is unshifted, like cosmos-rl's labels: the loss pairs logits[:, :-1] with
targets[:, 1:] and loss_mask[:, 1:] (`next_token_targets`).

An assistant turn is found by its header token sequence (`<|im_start|>` then the tokens of
"assistant\\n"); it runs to the next `<|im_end|>`, or to the end of the row when the conversation was
truncated inside it (then there is no end-of-turn token to count). cosmos-rl tokenises each
assistant content on its own and splices it in; a tokenizer whose merges cross the "assistant\\n"
boundary (content starting with a newline) would render a different header: this function then
finds no turn there, so build such rows segment by segment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORE_INDEX = -100  # cosmos-rl / transformers label for "no loss here"


@dataclass(frozen=True)
class ChatTokens:
    """The token ids the mask needs (from the tokenizer, or the tiny test config's 0..6)."""

    im_end: int
    assistant_header: tuple[int, ...]  # "<|im_start|>assistant\n" as the template renders it
    media: tuple[int, ...] = ()  # <|image_pad|>, <|video_pad|>: never trained on

    def __post_init__(self):
        if len(self.assistant_header) < 2:
            raise ValueError(f"assistant_header {self.assistant_header} must hold <|im_start|> and the "
                             "role's tokens")
        if self.im_end in self.assistant_header:
            raise ValueError(f"assistant_header {self.assistant_header} contains im_end {self.im_end}")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTokens:
        """Qwen3-VL's special tokens looked up by name in a transformers tokenizer."""
        names = ("<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>")
        ids = {n: tokenizer.convert_tokens_to_ids(n) for n in names}
        unk = getattr(tokenizer, "unk_token_id", None)
        missing = [n for n, i in ids.items() if i is None or (unk is not None and i == unk)]
        if missing:
            raise ValueError(f"tokenizer has no id for {missing}; is this a Qwen3-VL tokenizer?")
        header = tuple(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))
        if not header or header[0] != ids["<|im_start|>"]:
            raise ValueError(f"'<|im_start|>assistant\\n' encodes to {header}, which does not start with "
                             f"<|im_start|> ({ids['<|im_start|>']})")
        return cls(ids["<|im_end|>"], header, (ids["<|image_pad|>"], ids["<|video_pad|>"]))


def _row_mask(ids: np.ndarray, tokens: ChatTokens) -> np.ndarray:
    header = np.asarray(tokens.assistant_header)
    n, h = ids.shape[0], header.shape[0]
    mask = np.zeros(n, bool)
    if n <= h:
        return mask
    windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], h)  # a header must have content after it
    starts = np.flatnonzero((windows == header).all(axis=1)) + h
    ends = np.flatnonzero(ids == tokens.im_end)
    delta = np.zeros(n + 1, np.int64)
    for start in starts:
        k = np.searchsorted(ends, start)
        stop = ends[k] + 1 if k < ends.shape[0] else n  # <|im_end|> included; truncated: to the end
        delta[start] += 1
        delta[stop] -= 1
    mask = np.cumsum(delta[:n]) > 0
    if tokens.media:
        mask &= ~np.isin(ids, tokens.media)
    return mask


def assistant_mask(input_ids, tokens: ChatTokens, attention_mask=None) -> np.ndarray:
    """bool mask, same shape as input_ids ([L] or [B, L]): True on the tokens SFT trains on."""
    ids = np.asarray(input_ids)
    if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"input_ids must be integer [L] or [B, L], got {ids.dtype} {ids.shape}")
    rows = ids.reshape(-1, ids.shape[-1])
    mask = np.stack([_row_mask(r, tokens) for r in rows]).reshape(ids.shape)
    if attention_mask is not None:
        attn = np.asarray(attention_mask)
        if attn.shape != ids.shape:
            raise ValueError(f"attention_mask {attn.shape} does not match input_ids {ids.shape}")
        mask &= attn.astype(bool)
    return mask


def sft_labels(input_ids, mask) -> np.ndarray:
    """cosmos-rl's labels: the token id where the mask is set, IGNORE_INDEX (-100) elsewhere."""
    ids = np.asarray(input_ids)
    return np.where(np.asarray(mask, bool), ids, IGNORE_INDEX).astype(np.int64)


def next_token_targets(input_ids, mask) -> tuple[np.ndarray, np.ndarray]:
    """(targets, loss_mask) [B, L-1] for logits[:, :-1]: position t predicts token t+1, which counts
    when the mask holds at t+1 (so the last header token predicts the first content token, and the
    last content token predicts <|im_end|>)."""
    ids = np.atleast_2d(np.asarray(input_ids))
    m = np.atleast_2d(np.asarray(mask, bool))
    return ids[:, 1:], m[:, 1:]
