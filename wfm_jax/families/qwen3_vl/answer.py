"""Answering questions with a Qwen3-VL (Cosmos-Reason2) model directory: load, format, preprocess,
generate, decode. The library side of `python -m wfm_jax.generate --model VLM_DIR ...`.

Everything comes from the files of the directory, as transformers' `from_pretrained` would take
it: weights and config.json (the model), tokenizer.json + chat template (chat_template.jinja or
tokenizer_config.json), preprocessor_config.json / video_preprocessor_config.json (the pixels),
generation_config.json (end and pad tokens; else the text config's). Each prompt becomes one user
turn, the image or video first and then the text, plus the generation prompt, exactly as
`apply_chat_template(messages, add_generation_prompt=True)` renders it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from wfm_jax.families.qwen3_vl.preprocess import (
    Qwen3VLProcessor,
    Video,
    load_vision_configs,
    read_video,
    user_turn,
)
from wfm_jax.models.qwen3_vl.generate import Sampling, generate

ARCHITECTURE = "Qwen3VLForConditionalGeneration"


def vlm_config(directory: str) -> dict | None:
    """config.json of a Qwen3-VL model dir (model_type qwen3_vl or its architecture), else None."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    if not isinstance(config, dict):
        return None
    if config.get("model_type") == "qwen3_vl" or ARCHITECTURE in (config.get("architectures") or []):
        return config
    return None


def read_image(path: str):
    """An image file as a PIL image (converted to RGB by the processor, as transformers does)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            return im.copy()
    except (OSError, UnidentifiedImageError) as e:  # missing file, not an image
        raise ValueError(f"cannot read image {path}: {e}") from e


def load_video(path: str) -> Video:
    """A video file's frames and frame rate; the processor samples them by its own fps setting."""
    if not os.path.isfile(path):
        raise ValueError(f"cannot read video {path}: no such file")
    try:
        return read_video(path)
    except ImportError as e:
        raise ValueError(f"cannot read video {path}: {e}") from e


def _end_tokens(directory: str, config: dict) -> tuple[list[int], int]:
    """(end ids, pad id) from generation_config.json when present, else the text config's, as
    transformers' GenerationConfig.from_pretrained / from_model_config pick them."""
    gen, path = {}, os.path.join(directory, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            gen = json.load(f)
    text = config.get("text_config") or {}
    eos = gen.get("eos_token_id", text.get("eos_token_id", config.get("eos_token_id")))
    eos = [] if eos is None else [int(e) for e in np.atleast_1d(eos)]
    pad = gen.get("pad_token_id", text.get("pad_token_id", config.get("pad_token_id")))
    return eos, int(eos[0] if pad is None and eos else pad or 0)


def load_processor(directory: str) -> Qwen3VLProcessor:
    """The directory's tokenizer + chat template and, when it has them, its image / video settings
    (a directory without preprocessor_config.json answers text-only prompts)."""
    from transformers import AutoTokenizer  # lazy: the DiT path never needs it

    if not os.path.isfile(os.path.join(directory, "tokenizer.json")):
        raise ValueError(f"{directory}: no tokenizer.json")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as e:  # json, tokenizers (a bare Exception from rust) and transformers errors
        raise ValueError(f"{directory}: cannot load the tokenizer: {e}") from e
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{directory}: no chat template (chat_template.jinja or tokenizer_config.json)")
    try:
        image, video = load_vision_configs(directory)
    except FileNotFoundError:
        image = video = None
    return Qwen3VLProcessor(tokenizer, image, video)


@dataclasses.dataclass
class Answers:
    texts: list[str]  # decoded answer per prompt (up to its end token, special tokens dropped)
    token_ids: np.ndarray  # (B, T) int32 generated ids; rows that ended early hold the pad id after
    prompts: list[str]  # the templated prompt texts (before placeholder expansion)


class VisionLanguageModel:
    """A loaded Qwen3-VL model directory: the Flax model, its processor and its end tokens."""

    def __init__(self, model: Any, processor: Qwen3VLProcessor, eos_token_ids: list[int],
                 pad_token_id: int):
        self.model, self.processor = model, processor
        self.eos_token_ids, self.pad_token_id = eos_token_ids, pad_token_id

    @classmethod
    def load(cls, directory: str, *, dtype=None, processor: Qwen3VLProcessor | None = None
             ) -> VisionLanguageModel:
        """processor: the directory's, already loaded (load_processor), e.g. to check the inputs
        against it before the weights are read."""
        from converters.loading import load_model

        config = vlm_config(directory)
        if config is None:
            raise ValueError(f"{directory} is not a Qwen3-VL model dir (config.json with model_type "
                             f"qwen3_vl / architectures {ARCHITECTURE})")
        processor = processor or load_processor(directory)  # files first: fail before the weights
        model, _ = load_model(directory, dtype=dtype)
        return cls(model, processor, *_end_tokens(directory, config))

    @property
    def takes_images(self) -> bool:
        return self.processor.image_config is not None

    @property
    def takes_videos(self) -> bool:
        return self.processor.video_config is not None

    def format(self, prompts: list[str], images: int = 0, videos: int = 0) -> list[str]:
        """Each prompt as one user turn (images, videos, text) + the generation prompt."""
        return [self.processor.apply_chat_template(user_turn(p, images, videos),
                                                   add_generation_prompt=True) for p in prompts]

    def inputs(self, prompts: list[str], image=None, video: Video | None = None) -> dict[str, np.ndarray]:
        """Model inputs for the prompts, left padded; the image / video goes with every prompt."""
        if image is not None and not self.takes_images:
            raise ValueError("this model dir has no image processor settings (preprocessor_config.json): "
                             "it answers text only")
        if video is not None and not self.takes_videos:
            raise ValueError("this model dir has no video processor settings "
                             "(video_preprocessor_config.json / preprocessor_config.json): no --video")
        texts = self.format(prompts, images=int(image is not None), videos=int(video is not None))
        return self.processor(texts, images=[image] * len(prompts) if image is not None else None,
                              videos=[video] * len(prompts) if video is not None else None,
                              padding_side="left")

    def decode(self, token_ids: np.ndarray) -> list[str]:
        out = []
        for row in np.asarray(token_ids):
            ends = np.flatnonzero(np.isin(row, self.eos_token_ids))
            row = row[:ends[0]] if len(ends) else row
            out.append(self.processor.tokenizer.decode(row.tolist(), skip_special_tokens=True))
        return out

    def answer(self, prompts: str | list[str], *, image=None, video: Video | None = None,
               max_new_tokens: int = 256, sampling: Sampling | None = None, seed: int = 0) -> Answers:
        """Answers to the prompts (one batch); greedy unless `sampling` sets a temperature."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise ValueError("give at least one prompt")
        batch = self.inputs(prompts, image, video)
        ids = generate(self.model, batch["input_ids"], batch["attention_mask"],
                       pixel_values=batch.get("pixel_values"), image_grid_thw=batch.get("image_grid_thw"),
                       pixel_values_videos=batch.get("pixel_values_videos"),
                       video_grid_thw=batch.get("video_grid_thw"), max_new_tokens=max_new_tokens,
                       sampling=sampling or Sampling(), seed=seed, eos_token_ids=self.eos_token_ids,
                       pad_token_id=self.pad_token_id)
        return Answers(self.decode(ids), ids, self.format(prompts, int(image is not None),
                                                          int(video is not None)))


def answer(directory: str, prompts: str | list[str], *, image: str | None = None,
           video: str | None = None, **kwargs: Any) -> Answers:
    """Load `directory`, read the image / video file, answer (kwargs: VisionLanguageModel.answer's)."""
    if image is not None and video is not None:
        raise ValueError("give an image or a video, not both")
    pixels = read_image(image) if image is not None else None
    clip = load_video(video) if video is not None else None
    return VisionLanguageModel.load(directory).answer(prompts, image=pixels, video=clip, **kwargs)
