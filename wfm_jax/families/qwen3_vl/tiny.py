"""A tiny Qwen3-VL model directory with random weights, built in process (no hub download).

    config.json, generation_config.json, model.safetensors   (converters.qwen3_vl.export)
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    preprocessor_config.json, video_preprocessor_config.json

`Qwen3VLForConditionalGeneration.from_pretrained` (transformers) and the project's
`Qwen3VLProcessor.from_pretrained` load it. The tokenizer is Qwen's kind (byte-level BPE, the
Qwen3-VL special tokens) whose vocabulary holds each of `words` whole, with and without a leading
space, and `<think>`, `</think>`, `<answer>`, `</answer>` as single tokens, so a world's prompts
and answers stay short. Images: min 64x64, max 96x96 pixels, so a 96x96 picture keeps its size
(grid 1x6x6, 9 visual tokens) and larger ones shrink to at most that.

Default size (`VQA_TEXT`, `VQA_VISION`, 1.1 M parameters, 4.4 MB in fp32): twice the width of
the CPU-test config of specs/reason2.md §3 with four decoder layers, so that SFT can learn the
VQA world on two CPU cores; `size="spec"` gives §3's config (hidden 64, two layers).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")  # ids 0..6, as in the §3 config
PAD, IM_START, IM_END, VISION_START, VISION_END, IMAGE, VIDEO = range(7)
ROLE_WORDS = ("system", "user", "assistant")  # the chat template's headers, always whole
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")  # added (not special): decode keeps them

# Qwen3-VL Instruct's layout (reason2.md §2.3): no default system prompt, media items become
# <|vision_start|><|image_pad|><|vision_end|> (or video), text items concatenated in order.
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

_VISION_COMMON = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
IMAGE_PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
                   **_VISION_COMMON, "size": {"shortest_edge": 64 * 64, "longest_edge": 96 * 96}}
VIDEO_PROCESSOR = {"video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
                   **_VISION_COMMON, "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 8 * 96 * 96},
                   "fps": 2, "min_frames": 4, "max_frames": 768, "cap_pixels_per_frame": False}

SPEC_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "mrope_section": [4, 2, 2]}
SPEC_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
               "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1]}
VQA_TEXT = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "mrope_section": [8, 4, 4]}
VQA_VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
              "num_position_embeddings": 36, "deepstack_visual_indexes": [0, 1]}
SIZES = {"vqa": (VQA_TEXT, VQA_VISION), "spec": (SPEC_TEXT, SPEC_VISION)}
# Per-size init std of some weights (by a substring of their path), else `std`. The VQA size starts
# where a pretrained model's scales are, not at 0.02 everywhere:
# - text embeddings at unit RMS: at 0.02 a token's own identity is swamped by the first
#   attention's output, and the tiny model never learns even to copy a word from the question;
# - every vision MLP's output layer (the blocks' and the mergers'), so that visual tokens enter
#   at about the RMS of text tokens;
# - a vision position table strong enough that the random tower's tokens still say which cell
#   they are (a linear probe cannot tell at 0.02; at 0.5 it can, 1.00 held-out).
# docs/reason2_post_training.md has the measurements.
INIT_STD = {"vqa": {"embed_tokens": 1.0, "linear_fc2": 0.36, "pos_embed": 0.5}, "spec": {}}


def _byte_alphabet() -> list[str]:
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def build_tokenizer(words: Iterable[str] = ()):
    """A transformers fast tokenizer: the seven Qwen3-VL special tokens (ids 0..6), 256 byte
    symbols, one token per `words` entry (also with Qwen's leading-space symbol 'Ġ') and the
    think/answer tags. Raises if a word does not come out as one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [w for w in dict.fromkeys([*ROLE_WORDS, *words]) if w]
    bad = [w for w in words if not w.isascii() or not w.isalnum()]
    if bad:
        raise ValueError(f"tokenizer words must be ASCII letters/digits, got {bad}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for sym in _byte_alphabet() + words + ["Ġ" + w for w in words]:
        vocab.setdefault(sym, len(vocab))
    # No merges: a pre-tokenized word found whole in the vocabulary is one token (ignore_merges,
    # as Llama 3's BPE does), anything else falls back to one token per byte.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.add_tokens(list(TAG_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    split = [w for w in words for text in (w, " " + w) if len(fast.encode(text)) != 1]
    if split:
        raise RuntimeError(f"the tiny tokenizer splits {sorted(set(split))}")
    return fast


def model_config(vocab_size: int, size: str = "vqa") -> dict:
    """The Qwen3-VL config.json content; `vocab_size` rounds up to a multiple of 64."""
    if size not in SIZES:
        raise ValueError(f"size {size!r}: expected one of {', '.join(SIZES)}")
    text, vision = SIZES[size]
    text = dict(text)
    section = text.pop("mrope_section")
    return {
        "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END, "tie_word_embeddings": True,
        "text_config": {"model_type": "qwen3_vl_text", "vocab_size": -(-vocab_size // 64) * 64, **text,
                        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                        "attention_bias": False, "tie_word_embeddings": True,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                            "mrope_section": section, "mrope_interleaved": True},
                        "bos_token_id": PAD, "eos_token_id": IM_END, "pad_token_id": PAD},
        "vision_config": {"model_type": "qwen3_vl_vision", **vision, "in_channels": 3, "patch_size": 16,
                          "temporal_patch_size": 2, "spatial_merge_size": 2,
                          "out_hidden_size": text["hidden_size"], "hidden_act": "gelu_pytorch_tanh"},
    }


def random_model(config: dict, seed: int = 0, std: float = 0.02, overrides: dict[str, float] | None = None):
    """The Flax model with weights drawn by numpy: normal(0, std) for matrices, embeddings and
    position tables (normal(0, overrides[k]) where the path contains k), ones for norm scales,
    zeros for biases. Built abstract first (nnx.eval_shape): running the initialisers eagerly or
    under jit costs about a minute on two busy cores."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.qwen3_vl.model import make_model

    model = abstract_module(lambda: make_model(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(seed)
    for path, var in nnx.state(model, nnx.Param).flat_state():
        leaf, shape = str(path[-1]), tuple(var.get_value().shape)
        if leaf == "scale":
            value = np.ones(shape, np.float32)
        elif leaf == "bias":
            value = np.zeros(shape, np.float32)
        else:
            name = ".".join(str(p) for p in path)
            scale = next((v for k, v in (overrides or {}).items() if k in name), std)
            value = (scale * rng.standard_normal(shape)).astype(np.float32)
        var.set_value(jnp.asarray(value, dtype=var.get_value().dtype))
    return model


def write_processor_files(directory: str, words: Iterable[str] = ()) -> int:
    """Tokenizer, chat template and image / video processor json into `directory`; -> vocab size."""
    tokenizer = build_tokenizer(words)
    tokenizer.save_pretrained(directory)
    for name, content in (("preprocessor_config.json", IMAGE_PROCESSOR),
                          ("video_preprocessor_config.json", VIDEO_PROCESSOR)):
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=1)
    if not os.path.isfile(os.path.join(directory, "chat_template.jinja")):
        raise RuntimeError("transformers did not write chat_template.jinja")
    return len(tokenizer)


def build_tiny_qwen3_vl(directory: str, words: Iterable[str] = (), *, seed: int = 0, size: str = "vqa",
                        overwrite: bool = False) -> str:
    """Write the tiny model directory, all or nothing (converters.qwen3_vl.export renames a
    finished temporary directory into place). Weights: `random_model(config, seed)` with the size's
    INIT_STD."""
    from converters.qwen3_vl import export

    directory = os.path.abspath(directory)
    full = os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory))
    if full and not overwrite:
        raise FileExistsError(f"{directory} exists and is not empty")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.proc-", dir=parent)
    try:
        vocab = write_processor_files(staging, words)
        model = random_model(model_config(vocab, size), seed, overrides=INIT_STD[size])
        export(model, directory, processor_dir=staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def ensure_tiny_qwen3_vl(directory: str, words: Iterable[str] = (), **kwargs) -> str:
    """Build unless `directory` already holds a model (safe if another process races)."""
    done = os.path.join(directory, "config.json")
    if os.path.isfile(done):
        return os.path.abspath(directory)
    try:
        return build_tiny_qwen3_vl(directory, words, **kwargs)
    except (FileExistsError, OSError):
        if os.path.isfile(done):
            return os.path.abspath(directory)
        raise
