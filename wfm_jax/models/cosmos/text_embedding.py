"""Cosmos-Predict2.5's prompt embedding (diffusers'
`Cosmos2_5_PredictBasePipeline._get_prompt_embeds`): the chat-templated prompt through the
Qwen2.5-VL (Cosmos-Reason1) text tower with no attention mask, each hidden state after the
embeddings normalised over the hidden dim, all concatenated (num_hidden_layers * hidden_size
wide: 28 * 3584 = 100352 for Reason1-7B).

Token ids are built on the host with the pipeline's transformers tokenizer (`prompt_token_ids`);
the embedding is jittable (`reason1_embedding`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

SYSTEM_PROMPT = "You are a helpful assistant who will provide prompts to an image generator."
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default
EPS = 1e-8  # added to the std, as diffusers does


def conversation(prompt: str) -> list[dict]:
    """The chat diffusers templates for one prompt (system instruction, then the user's text)."""
    return [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
            {"role": "user", "content": [{"type": "text", "text": prompt}]}]


def load_tokenizer(pipeline_dir: str, subfolder: str = "tokenizer"):
    """The pipeline's transformers tokenizer (Qwen2.5-VL's, with its chat template), offline."""
    from transformers import AutoTokenizer
    path = os.path.join(pipeline_dir, subfolder)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no {subfolder}/ in pipeline directory {pipeline_dir}")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def prompt_token_ids(tokenizer, prompts: str | Sequence[str],
                     max_sequence_length: int = MAX_SEQUENCE_LENGTH) -> np.ndarray:
    """(B, max_sequence_length) int32 ids exactly as diffusers builds them: the chat template
    without a generation prompt, truncated and padded to max_sequence_length (no mask is kept:
    the pipeline passes none to the encoder)."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    rows = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            conversation(prompt), tokenize=True, add_generation_prompt=False,
            add_vision_id=False, max_length=max_sequence_length, truncation=True,
            padding="max_length")
        ids = ids["input_ids"] if not isinstance(ids, list) and "input_ids" in ids else ids
        if len(ids) != max_sequence_length:  # a tokenizer that ignored padding/truncation
            raise ValueError(f"the tokenizer gave {len(ids)} ids for a prompt, expected "
                             f"max_sequence_length {max_sequence_length}")
        rows.append(ids)
    return np.asarray(rows, np.int32)


def normalize_hidden_states(hidden_states: Sequence[jax.Array], dtype=None) -> jax.Array:
    """(B, S, L * D): each of hidden_states[1:] as (h - mean) / (std + 1e-8) over D, with the
    unbiased (n - 1) std as torch.std, concatenated in layer order. Computed in fp32 (diffusers
    computes in the encoder's dtype; identical in fp32), returned in `dtype` (default: the
    hidden states' dtype)."""
    dtype = dtype or hidden_states[-1].dtype
    out = []
    for h in hidden_states[1:]:
        h = h.astype(jnp.float32)
        mean = jnp.mean(h, axis=-1, keepdims=True)
        std = jnp.std(h, axis=-1, keepdims=True, ddof=1)
        out.append((h - mean) / (std + EPS))
    return jnp.concatenate(out, axis=-1).astype(dtype)


def reason1_embedding(encoder, input_ids: jax.Array, dtype=None) -> jax.Array:
    """The prompt embedding from token ids: `encoder` is a Qwen2.5-VL text tower (QwenTextModel
    or Qwen2_5_VLEncoder) returning all hidden states; no attention mask, as diffusers."""
    return normalize_hidden_states(encoder(input_ids), dtype)


__all__ = [
    "MAX_SEQUENCE_LENGTH",
    "SYSTEM_PROMPT",
    "conversation",
    "load_tokenizer",
    "normalize_hidden_states",
    "prompt_token_ids",
    "reason1_embedding",
]
