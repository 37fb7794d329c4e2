"""Qwen3-VL configuration (transformers' Qwen3VLConfig / Qwen3VLTextConfig / Qwen3VLVisionConfig):
the fields that change the computation, read from a config.json dict and written back to one
that `Qwen3VLForConditionalGeneration.from_pretrained` loads."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


def _rope(sub: Mapping[str, Any]) -> Mapping[str, Any]:
    """5.x stores `rope_parameters`; 4.57-era checkpoints `rope_scaling` + top-level `rope_theta`."""
    rope = dict(sub.get("rope_parameters") or sub.get("rope_scaling") or {})
    if "rope_theta" not in rope and sub.get("rope_theta") is not None:
        rope["rope_theta"] = sub["rope_theta"]
    return rope


def _pick(cls, sub: Mapping[str, Any], skip: set[str]) -> dict:
    names = {f.name for f in dataclasses.fields(cls)} - skip
    return {k: v for k, v in sub.items() if k in names and v is not None}


@dataclasses.dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 128000
    rope_theta: float = 500000.0  # transformers' Qwen3VLTextConfig.default_theta
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, sub: Mapping[str, Any]) -> TextConfig:
        kw = _pick(cls, sub, {"rope_theta", "mrope_section"})
        if sub.get("num_key_value_heads", 0) is None:  # as transformers: None means MHA
            kw["num_key_value_heads"] = kw.get("num_attention_heads", cls.num_attention_heads)
        rope = _rope(sub)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "mrope"):
            raise ValueError(f"unsupported Qwen3-VL text rope_type {kind!r}; supported: default")
        if rope.get("mrope_interleaved") is False:
            raise ValueError("Qwen3-VL with mrope_interleaved=false is not supported")
        kw["rope_theta"] = float(rope.get("rope_theta", cls.rope_theta))
        kw["mrope_section"] = tuple(int(s) for s in rope.get("mrope_section", cls.mrope_section))
        cfg = cls(**kw)
        half = cfg.head_dim // 2
        if len(cfg.mrope_section) != 3 or sum(cfg.mrope_section) != half or max(
                3 * cfg.mrope_section[1], 3 * cfg.mrope_section[2]) > half:
            raise ValueError(f"mrope_section {list(cfg.mrope_section)} does not fit head_dim "
                             f"{cfg.head_dim} (sum must be {half}, 3*section[1|2] <= {half})")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {cfg.num_key_value_heads}")
        return cfg

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("rope_theta", "mrope_section")}
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                  "mrope_section": list(self.mrope_section),
                                  "mrope_interleaved": True}
        return {"model_type": "qwen3_vl_text", **out}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, sub: Mapping[str, Any]) -> VisionConfig:
        kw = _pick(cls, sub, {"rope_theta", "deepstack_visual_indexes"})
        if "deepstack_visual_indexes" in sub:
            kw["deepstack_visual_indexes"] = tuple(int(i) for i in sub["deepstack_visual_indexes"])
        rope = _rope(sub)
        kind = rope.get("rope_type", "axial")
        if kind != "axial":
            raise ValueError(f"unsupported Qwen3-VL vision rope_type {kind!r}; supported: axial")
        kw["rope_theta"] = float(rope.get("rope_theta", cls.rope_theta))
        cfg = cls(**kw)
        side = math.isqrt(cfg.num_position_embeddings)
        if side * side != cfg.num_position_embeddings:
            raise ValueError(f"num_position_embeddings {cfg.num_position_embeddings} is not a square")
        if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 4:
            raise ValueError(f"vision head_dim {cfg.hidden_size}/{cfg.num_heads} must be an "
                             f"integer divisible by 4")
        bad = [i for i in cfg.deepstack_visual_indexes if not 0 <= i < cfg.depth]
        if bad:
            raise ValueError(f"deepstack_visual_indexes {bad} outside the {cfg.depth} vision blocks")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rope_theta"}
        out["deepstack_visual_indexes"] = list(self.deepstack_visual_indexes)
        out["rope_parameters"] = {"rope_type": "axial", "rope_theta": self.rope_theta}
        return {"model_type": "qwen3_vl_vision", **out}


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
    text: TextConfig
    vision: VisionConfig
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    # bos/eos/pad ids: kept for export and generation defaults, (name, value) pairs so the
    # config stays hashable (it is static in jit-compiled functions)
    token_ids: tuple[tuple[str, Any], ...] = ()

    @property
    def text_extra(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.token_ids}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> Qwen3VLConfig:
        if config.get("model_type", "qwen3_vl") != "qwen3_vl":
            raise ValueError(f"not a Qwen3-VL config: model_type {config.get('model_type')!r}")
        text_dict = config.get("text_config") or {}
        text, vision = TextConfig.from_dict(text_dict), VisionConfig.from_dict(
            config.get("vision_config") or {})
        if vision.out_hidden_size != text.hidden_size:
            raise ValueError(f"vision out_hidden_size {vision.out_hidden_size} != text hidden_size "
                             f"{text.hidden_size}")
        if len(vision.deepstack_visual_indexes) > text.num_hidden_layers:
            raise ValueError(f"{len(vision.deepstack_visual_indexes)} deepstack_visual_indexes but "
                             f"only {text.num_hidden_layers} text decoder layers")
        ids = {k: int(config[k]) for k in ("image_token_id", "video_token_id",
                                           "vision_start_token_id", "vision_end_token_id")
               if config.get(k) is not None}
        extra = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                             for k, v in text_dict.items()
                             if k in ("bos_token_id", "eos_token_id", "pad_token_id") and v is not None))
        # transformers 5 ties on the top-level flag (the text config's copy is not read)
        return cls(text=text, vision=vision, tie_word_embeddings=bool(config.get(
            "tie_word_embeddings", False)), token_ids=extra, **ids)

    def to_dict(self) -> dict:
        text = {**self.text.to_dict(), **self.text_extra,
                "tie_word_embeddings": self.tie_word_embeddings}
        return {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
                "image_token_id": self.image_token_id, "video_token_id": self.video_token_id,
                "vision_start_token_id": self.vision_start_token_id,
                "vision_end_token_id": self.vision_end_token_id,
                "tie_word_embeddings": self.tie_word_embeddings,
                "text_config": text, "vision_config": self.vision.to_dict()}


def as_config(config: Qwen3VLConfig | Mapping[str, Any]) -> Qwen3VLConfig:
    return config if isinstance(config, Qwen3VLConfig) else Qwen3VLConfig.from_dict(config)
