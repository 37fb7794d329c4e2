"""A tiny Qwen3-VL processor directory built in process (no hub download): a byte-level tokenizer
whose special tokens sit at the ids of the tiny model config in reason2.md section 3, a
Qwen3-VL-style chat template, and image / video processor json files."""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]  # ids 0..6: pad, -, eos, vision start/end, image, video

# The Qwen3-VL Instruct layout (reason2.md 2.3): no default system prompt, media items become
# <|vision_start|><|image_pad|><|vision_end|> (or video), text items are concatenated in order.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The released Qwen3-VL / Cosmos-Reason2 values (reason2.md 2.1, 2.2).
RELEASED_IMAGE = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                  "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
RELEASED_VIDEO = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                  "size": {"shortest_edge": 4096, "longest_edge": 25165824},
                  "fps": 2, "min_frames": 4, "max_frames": 768}
# Small budgets so CPU tests stay fast but still hit both the min and the max rule.
SMALL_IMAGE = {**RELEASED_IMAGE, "size": {"shortest_edge": 64 * 64, "longest_edge": 160 * 160}}
SMALL_VIDEO = {**RELEASED_VIDEO, "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 8 * 96 * 96},
               "cap_pixels_per_frame": False}


def build_tokenizer():
    """Byte-level BPE without merges: every string encodes (one token per byte), specials are whole."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(byte_chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_processor_dir(path: str | Path, image: dict | None = None, video: dict | None = None) -> Path:
    """tokenizer.json, tokenizer_config.json, chat_template.jinja, preprocessor_config.json and
    video_preprocessor_config.json in `path`, loadable by transformers' AutoProcessor."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(str(path))
    image = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
             **(SMALL_IMAGE if image is None else image)}
    video = {"video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
             **(SMALL_VIDEO if video is None else video)}
    (path / "preprocessor_config.json").write_text(json.dumps(image, indent=1))
    (path / "video_preprocessor_config.json").write_text(json.dumps(video, indent=1))
    if not (path / "chat_template.jinja").is_file():
        raise RuntimeError("transformers did not write chat_template.jinja")
    return path
