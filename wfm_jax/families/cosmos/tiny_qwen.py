"""A tiny offline stand-in for Cosmos-Predict2.5's text encoder and tokenizer (Qwen2.5-VL).

`qwen_tokenizer()` is a byte-level BPE Qwen2Tokenizer (the 256 byte symbols plus a few merges and
the chat special tokens) carrying Qwen2.5-VL-Instruct's released chat template, so
`apply_chat_template` produces the same token structure the real one does. `QWEN_CONFIG` is a
tiny Qwen2_5_VLConfig dict (transformers' nested layout) whose vision tower is as small as
transformers allows.
"""
from __future__ import annotations

from wfm_jax.families.tiny import byte_symbols

# Qwen/Qwen2.5-VL-7B-Instruct's chat_template (tokenizer_config.json / chat_template.json).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MERGES = [("Ġ", "a"), ("t", "h"), ("th", "e"), ("Ġ", "the"), ("o", "n"), ("e", "r")]


def qwen_tokenizer():
    from transformers import Qwen2Tokenizer
    tokens = byte_symbols() + ["".join(m) for m in MERGES]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    tok = Qwen2Tokenizer(vocab=vocab, merges=list(MERGES),
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tok.add_tokens([SPECIAL_TOKENS[0]], special_tokens=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def qwen_config(vocab_size: int, hidden_size: int = 32, num_hidden_layers: int = 2,
                tie_word_embeddings: bool = False) -> dict:
    """A tiny Qwen2_5_VLConfig dict; the text width times the layers is the embedding width."""
    return dict(
        architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl",
        tie_word_embeddings=tie_word_embeddings,
        text_config=dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=48,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                         rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                              mrope_section=[1, 1, 2])),
        vision_config=dict(depth=1, hidden_size=8, intermediate_size=12, num_heads=2,
                           out_hidden_size=hidden_size, patch_size=2, temporal_patch_size=1,
                           spatial_merge_size=1))
