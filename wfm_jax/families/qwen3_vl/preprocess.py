"""Qwen3-VL (Cosmos-Reason2) preprocessing in numpy + PIL, no torch at run time.

Mirrors transformers 5.23.0: `Qwen2VLImageProcessor(Pil)` for images, `Qwen3VLVideoProcessor` for
videos and `Qwen3VLProcessor` for placeholder expansion, tokenisation and `mm_token_type_ids`
(`/work/shared/specs/reason2.md` section 2). Every setting comes from the files of a model directory;
the class defaults below only fill keys a file leaves out, exactly as transformers' classes do.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# transformers' class attributes, used only for keys the json leaves out (never the released values).
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGE_CLASS_DEFAULTS: dict[str, Any] = {  # Qwen2VLImageProcessor
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
    "image_mean": _CLIP_MEAN, "image_std": _CLIP_STD, "rescale_factor": 1 / 255,
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
}
VIDEO_CLASS_DEFAULTS: dict[str, Any] = {  # Qwen3VLVideoProcessor
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "image_mean": (0.5, 0.5, 0.5), "image_std": (0.5, 0.5, 0.5), "rescale_factor": 1 / 255,
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    "fps": 2, "num_frames": None, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
    "cap_pixels_per_frame": None, "max_video_tokens": 768,
}
_RESAMPLE = {0: Image.NEAREST, 1: Image.LANCZOS, 2: Image.BILINEAR, 3: Image.BICUBIC, 4: Image.BOX,
             5: Image.HAMMING}


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) divisible by `factor`, area within [min_pixels, max_pixels], aspect ratio kept.
    Python's `round` (half to even) on purpose: transformers uses it."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {height}x{width}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                       min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The video rule: like `smart_resize` but the budget counts all (rounded) frames."""
    if num_frames < temporal_factor:
        raise ValueError(f"a video needs at least {temporal_factor} frames, got {num_frames}")
    if height < factor or width < factor:  # tiny frames are first scaled up to one factor
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {height}x{width}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Image or video processor settings (one json file's worth)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    rescale_factor: float
    do_resize: bool
    do_rescale: bool
    do_normalize: bool
    do_convert_rgb: bool
    resample: int
    # video only
    fps: float | None = None
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    do_sample_frames: bool = True
    cap_pixels_per_frame: bool | None = None
    max_video_tokens: int = 768

    @classmethod
    def from_dict(cls, d: dict[str, Any], defaults: dict[str, Any]) -> VisionConfig:
        """One processor json over `defaults` (IMAGE_ or VIDEO_CLASS_DEFAULTS). An explicit null
        keeps the default, except for fps / num_frames where null switches that sampling rule off."""
        merged = {**defaults, **{k: v for k, v in d.items() if v is not None or k in ("fps", "num_frames")}}
        size = dict(merged["size"] or {})
        if defaults is IMAGE_CLASS_DEFAULTS:  # legacy keys override `size` (Qwen2VLImageProcessor.__init__)
            for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
                if d.get(key) is not None:
                    size[edge] = d[key]
        if not size.get("shortest_edge") or not size.get("longest_edge"):
            raise ValueError(f"`size` must contain 'shortest_edge' and 'longest_edge', got {size}")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in merged.items() if k in names}
        kw.update(min_pixels=int(size["shortest_edge"]), max_pixels=int(size["longest_edge"]),
                  image_mean=tuple(np.broadcast_to(merged["image_mean"], 3).tolist()),
                  image_std=tuple(np.broadcast_to(merged["image_std"], 3).tolist()))
        return cls(**kw)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def load_vision_configs(model_dir: str | Path) -> tuple[VisionConfig, VisionConfig | None]:
    """Image and video settings with transformers' file priority: the nested entry of
    processor_config.json, then preprocessor_config.json (images) / video_preprocessor_config.json,
    then preprocessor_config.json (videos). No video settings -> None (images only)."""
    model_dir = Path(model_dir)
    nested = _json(model_dir / "processor_config.json") or {}
    pre = _json(model_dir / "preprocessor_config.json")
    image = nested.get("image_processor") or pre
    if image is None:
        raise FileNotFoundError(f"{model_dir}: no preprocessor_config.json (or processor_config.json "
                                "with an 'image_processor' entry)")
    video = nested.get("video_processor") or _json(model_dir / "video_preprocessor_config.json") or pre
    return (VisionConfig.from_dict(image, IMAGE_CLASS_DEFAULTS),
            VisionConfig.from_dict(video, VIDEO_CLASS_DEFAULTS) if video is not None else None)


def _as_uint8_hwc(image: Any, convert_rgb: bool, backend: str = "torchvision") -> np.ndarray:
    """PIL image or (H, W, C) uint8 array -> (H, W, 3) uint8, with transformers' `convert_to_rgb`:
    transparency is composited onto white (each backend rounds its own way), grey is repeated."""
    if isinstance(image, Image.Image):
        if not convert_rgb:
            return np.asarray(image)
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return np.asarray(Image.alpha_composite(white, image.convert("RGBA")).convert("RGB"))
        return np.asarray(image.convert("RGB"))
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"expected a PIL image or an (H, W, C) uint8 array, got {arr.dtype} {arr.shape}")
    if convert_rgb and arr.shape[-1] == 1:
        return np.repeat(arr, 3, axis=-1)
    if convert_rgb and arr.shape[-1] == 4 and backend == "torchvision":  # float32, x*255.999 truncated
        f = arr.astype(np.float32) * np.float32(1 / 255)
        rgb = f[..., :3] * f[..., 3:] + (np.float32(1) - f[..., 3:])
        return (rgb * np.float32(255.999)).astype(np.uint8)
    if convert_rgb and arr.shape[-1] == 4:
        alpha = arr[..., 3:4] / 255
        return np.round(alpha * arr[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return arr


def _bicubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _torch_uint8_pass(x: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    """One antialiased bicubic pass along `axis` with torch's CPU uint8 arithmetic (ATen
    UpSampleKernel, the path torchvision's resize takes for uint8 bicubic): PIL-style support and
    weights, quantised to int16 at the largest precision that fits, int accumulation, clip to uint8."""
    n_in = x.shape[axis]
    if n_in == n_out:
        return x
    scale = n_in / n_out
    support, inv = (2.0 * scale, 1.0 / scale) if scale >= 1.0 else (2.0, 1.0)
    taps = []
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        w = _bicubic((np.arange(lo, hi) - center + 0.5) * inv)
        taps.append((lo, w / w.sum() if w.sum() != 0 else w))
    max_w = max(float(np.abs(w).max()) for _, w in taps)
    prec = 0
    for prec in range(22):  # the first precision whose doubled largest weight overflows int16
        if int(0.5 + max_w * (1 << (prec + 1))) >= (1 << 15):
            break
    xm = np.moveaxis(x, axis, 0).astype(np.int64)
    out = np.empty((n_out, *xm.shape[1:]), np.int64)
    for i, (lo, w) in enumerate(taps):
        wq = np.trunc(w * (1 << prec) + np.where(w < 0, -0.5, 0.5)).astype(np.int64)
        out[i] = np.clip(((1 << (prec - 1)) + np.tensordot(wq, xm[lo:lo + len(w)], axes=(0, 0))) >> prec,
                         0, 255)
    return np.moveaxis(out.astype(np.uint8), 0, axis)


def _resize(frames: np.ndarray, height: int, width: int, resample: int, backend: str) -> np.ndarray:
    """Resize uint8 frames (..., H, W, C); identity when the size already matches.
    backend "torchvision": bit-exact with transformers' torchvision processors (the only video
    backend, and the image one whenever torchvision is installed); "pil": with the PIL image backend."""
    if frames.shape[-3:-1] == (height, width):
        return frames
    if backend == "pil":
        flat = frames.reshape(-1, *frames.shape[-3:])
        out = [np.asarray(Image.fromarray(f).resize((width, height), resample=_RESAMPLE[resample]))
               for f in flat]
        return np.stack(out).reshape(*frames.shape[:-3], height, width, frames.shape[-1])
    if backend != "torchvision":
        raise ValueError(f"resize backend must be 'torchvision' or 'pil', got {backend!r}")
    if resample != 3:
        raise NotImplementedError("the torchvision-exact resize implements BICUBIC (resample=3) only")
    # torch resizes horizontally first, then vertically, each through a uint8 intermediate
    return _torch_uint8_pass(_torch_uint8_pass(frames, width, frames.ndim - 2), height, frames.ndim - 3)


def _rescale_normalize(x: np.ndarray, cfg: VisionConfig, backend: str, channel_axis: int) -> np.ndarray:
    """uint8 -> float32, the way each transformers backend does it (differences are ~1e-7)."""
    shape = [1] * x.ndim
    shape[channel_axis] = 3
    mean = np.asarray(cfg.image_mean, np.float32).reshape(shape)
    std = np.asarray(cfg.image_std, np.float32).reshape(shape)
    if backend == "pil":  # numpy: rescale in float64 -> float32, then normalise in float32
        x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32) if cfg.do_rescale else x
        x = x.astype(np.float32)
        return (x - mean) / std if cfg.do_normalize else x
    x = x.astype(np.float32)
    if cfg.do_rescale and cfg.do_normalize:  # torchvision fuses both: (x - mean/s) / (std/s)
        inv = np.float32(1.0 / cfg.rescale_factor)
        return (x - mean * inv) / (std * inv)
    if cfg.do_rescale:
        return x * np.float32(cfg.rescale_factor)
    return (x - mean) / std if cfg.do_normalize else x


def preprocess_image(image: Any, cfg: VisionConfig,
                     backend: str = "torchvision") -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (patches (gh*gw, C*Tp*P*P) float32, grid (1, gh, gw)).
    Rows are in 2x2 merge-block order, each vector in (C, Tp, ph, pw) order, the frame repeated Tp times."""
    frame = _as_uint8_hwc(image, cfg.do_convert_rgb, backend)
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    if cfg.do_resize:
        h, w = smart_resize(frame.shape[0], frame.shape[1], p * m, cfg.min_pixels, cfg.max_pixels)
        frame = _resize(frame, h, w, cfg.resample, backend)
    x = _rescale_normalize(np.moveaxis(frame, -1, 0), cfg, backend, 0)  # (C, H, W)
    c, h, w = x.shape
    if h % (p * m) or w % (p * m):
        raise ValueError(f"image {h}x{w} is not divisible by patch*merge={p * m}; enable do_resize")
    gh, gw = h // p, w // p
    x = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (bh, bw, mh, mw, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, c * tp * p * p)), (1, gh, gw)


def sample_frame_indices(total_frames: int, video_fps: float | None, cfg: VisionConfig,
                         fps: float | None = None, num_frames: int | None = None) -> np.ndarray:
    """Qwen3VLVideoProcessor.sample_frames: `num_frames` or `fps` (not both; the config's fps applies
    when neither is given), clamped to [min_frames, max_frames] and the clip length, spread evenly."""
    if fps is not None and num_frames is not None:
        raise ValueError("`num_frames` and `fps` are mutually exclusive, pass only one")
    if num_frames is None:
        num_frames = cfg.num_frames
        fps = fps if fps is not None else cfg.fps
    else:
        fps = None
    if num_frames is None and fps is not None:
        if video_fps is None:
            raise ValueError("sampling by fps needs the video's own frame rate (video_fps)")
        num_frames = int(total_frames / video_fps * fps)
        num_frames = min(max(num_frames, cfg.min_frames), cfg.max_frames, total_frames)
    if num_frames is None:
        num_frames = min(max(total_frames, cfg.min_frames), cfg.max_frames)
    return np.linspace(0, total_frames - 1, num_frames).round().astype(int)


def frame_group_timestamps(indices: list[int] | np.ndarray, video_fps: float, group: int) -> list[float]:
    """Seconds shown before each temporal patch: mean of its first and last frame's time
    (indices padded with the last one to a multiple of `group`)."""
    idx = [int(i) for i in indices]
    idx += [idx[-1]] * (-len(idx) % group)
    ts = [i / video_fps for i in idx]
    return [(ts[i] + ts[i + group - 1]) / 2 for i in range(0, len(ts), group)]


def preprocess_video(frames: Any, cfg: VisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Already-sampled frames (T, H, W, C) uint8 -> (patches (gt*gh*gw, C*Tp*P*P) float32, grid)."""
    video = np.stack([_as_uint8_hwc(f, cfg.do_convert_rgb) for f in frames]) if isinstance(frames, list) \
        else np.asarray(frames)
    if video.dtype != np.uint8 or video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"expected video frames (T, H, W, 3) uint8, got {video.dtype} {video.shape}")
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    t = video.shape[0]
    if cfg.do_resize:
        factor, max_pixels = p * m, cfg.max_pixels
        if cfg.cap_pixels_per_frame:  # qwen-vl-utils' per-frame budget
            per_frame = max(min(cfg.max_video_tokens * factor * factor, cfg.max_pixels // t),
                            int(cfg.min_pixels * 1.05))
            max_pixels = per_frame * t
        h, w = smart_resize_video(t, video.shape[1], video.shape[2], tp, factor, cfg.min_pixels, max_pixels)
        video = _resize(video, h, w, cfg.resample, "torchvision")  # transformers has no PIL video backend
    x = _rescale_normalize(np.moveaxis(video, -1, 1), cfg, "torchvision", 1)  # (T, C, H, W)
    if pad := -t % tp:  # repeat the last frame up to a whole temporal patch
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    t, c, h, w = x.shape
    if h % (p * m) or w % (p * m):
        raise ValueError(f"frames {h}x{w} are not divisible by patch*merge={p * m}; enable do_resize")
    gt, gh, gw = t // tp, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


@dataclasses.dataclass
class Video:
    """A decoded clip: all its frames (T, H, W, 3) uint8 and its frame rate. `fps`/`num_frames`
    override the processor's sampling; `sampled=True` means the frames are already the sampled ones
    (then `indices` are their positions in the source clip, default 0..T-1)."""

    frames: Any
    video_fps: float | None
    fps: float | None = None
    num_frames: int | None = None
    sampled: bool = False
    indices: Any = None


def read_video(path: str | Path) -> Video:
    """Decode a video file with OpenCV (a project dependency) into all its RGB frames + frame rate."""
    import cv2  # lazy: only video files need it

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise ValueError(f"cannot open video {path}")
    fps, frames = cap.get(cv2.CAP_PROP_FPS), []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    cap.release()
    if not frames or not fps or fps <= 0:
        raise ValueError(f"{path}: no frames or no frame rate could be read")
    return Video(np.stack(frames), float(fps))


def user_turn(prompt: str, images: int = 0, videos: int = 0) -> list[dict[str, Any]]:
    """One user message: the images, then the videos, then the text (the generate CLI's layout)."""
    content = [{"type": "image"}] * images + [{"type": "video"}] * videos
    return [{"role": "user", "content": [*content, {"type": "text", "text": prompt}]}]


class Qwen3VLProcessor:
    """Chat template + placeholder expansion + tokenisation, as transformers' `Qwen3VLProcessor`.

    The tokenizer is a transformers tokenizer loaded from the model directory (tokenizer.json and its
    chat template from chat_template.jinja or tokenizer_config.json). `image_backend` picks which
    transformers image processor to reproduce bit for bit: "torchvision" (what AutoProcessor loads when
    torchvision is installed) or "pil" (Qwen2VLImageProcessorPil); videos always follow torchvision."""

    image_token = "<|image_pad|>"
    video_token = "<|video_pad|>"
    vision_start_token = "<|vision_start|>"
    vision_end_token = "<|vision_end|>"

    def __init__(self, tokenizer: Any, image_config: VisionConfig, video_config: VisionConfig | None,
                 image_backend: str = "torchvision"):
        if image_backend not in ("torchvision", "pil"):
            raise ValueError(f"image_backend must be 'torchvision' or 'pil', got {image_backend!r}")
        self.image_backend = image_backend
        self.tokenizer = tokenizer
        self.image_config = image_config
        self.video_config = video_config
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (self.image_token, self.video_token)}
        unk = getattr(tokenizer, "unk_token_id", None)
        missing = [t for t, i in ids.items() if i is None or (unk is not None and i == unk)]
        if missing:
            raise ValueError(f"tokenizer has no id for {missing}; is this a Qwen3-VL tokenizer?")
        self.image_token_id, self.video_token_id = ids[self.image_token], ids[self.video_token]

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, image_backend: str = "torchvision") -> Qwen3VLProcessor:
        from transformers import AutoTokenizer  # lazy: keeps `import preprocess` light

        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json")
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{model_dir}: no chat template (chat_template.jinja or tokenizer_config.json)")
        return cls(tokenizer, *load_vision_configs(model_dir), image_backend=image_backend)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """Render one conversation to text (content items of type image/video become placeholders)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **kwargs)

    def _video_placeholder(self, grid: tuple[int, int, int], indices: np.ndarray, video_fps: float) -> str:
        cfg = self.video_config
        per_group = grid[1] * grid[2] // cfg.merge_size**2
        stamps = frame_group_timestamps(indices, video_fps, cfg.temporal_patch_size)
        return "".join(f"<{stamps[k]:.1f} seconds>" + self.vision_start_token
                       + self.video_token * per_group + self.vision_end_token for k in range(grid[0]))

    def process_videos(self, videos: list[Video]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """-> pixel_values_videos, video_grid_thw, one placeholder string per video."""
        if self.video_config is None:
            raise ValueError("this model directory has no video processor settings")
        cfg = self.video_config
        patches, grids, texts = [], [], []
        for v in videos:
            frames = np.asarray(v.frames) if not isinstance(v.frames, list) else v.frames
            total = len(frames)
            if v.sampled or not cfg.do_sample_frames:
                indices = np.arange(total) if v.indices is None else np.asarray(v.indices)
                if len(indices) != total:
                    raise ValueError(f"{len(indices)} indices for {total} sampled frames")
            else:
                indices = sample_frame_indices(total, v.video_fps, cfg, v.fps, v.num_frames)
                frames = [frames[i] for i in indices] if isinstance(frames, list) else frames[indices]
            if v.video_fps is None:
                raise ValueError("Qwen3-VL prompts carry frame timestamps: pass the video's frame rate")
            pv, grid = preprocess_video(frames, cfg)
            patches.append(pv)
            grids.append(grid)
            texts.append(self._video_placeholder(grid, indices, v.video_fps))
        return np.concatenate(patches), np.asarray(grids, np.int64), texts

    def __call__(self, text: str | list[str], images: list[Any] | None = None,
                 videos: list[Video] | None = None, padding_side: str = "left") -> dict[str, np.ndarray]:
        """Templated text(s) with one `<|image_pad|>` / `<|video_pad|>` per image / video (in order
        over the batch) -> model inputs, padded to the longest sample (left by default)."""
        texts = [text] if isinstance(text, str) else list(text)
        images, videos = list(images or []), list(videos or [])
        for token, items in ((self.image_token, images), (self.video_token, videos)):
            found = sum(t.count(token) for t in texts)
            if found != len(items):
                raise ValueError(f"the text has {found} {token} placeholders but {len(items)} inputs "
                                 "were given")
        out: dict[str, np.ndarray] = {}
        replacements: dict[str, list[str]] = {"image": [], "video": []}
        if images:
            merged = [preprocess_image(im, self.image_config, self.image_backend) for im in images]
            out["pixel_values"] = np.concatenate([p for p, _ in merged])
            out["image_grid_thw"] = np.asarray([g for _, g in merged], np.int64)
            per = self.image_config.merge_size**2
            replacements["image"] = [self.image_token * (int(np.prod(g)) // per) for _, g in merged]
        if videos:
            pixels, grids, replacements["video"] = self.process_videos(videos)
            out["pixel_values_videos"], out["video_grid_thw"] = pixels, grids
        # Only the pad token itself is replaced (transformers 5.x `get_text_with_replacements`): the
        # template's own <|vision_start|>/<|vision_end|> around a video stay where they are.
        pattern = "|".join(f"(?P<{k}>{re.escape(tok)})" for k, tok in
                           (("image", self.image_token), ("video", self.video_token)) if replacements[k])
        if pattern:
            its = {k: iter(v) for k, v in replacements.items()}
            texts = [re.sub(pattern, lambda mt: next(its[mt.lastgroup]), t) for t in texts]
        enc = self.tokenizer(texts, padding=True, padding_side=padding_side, return_attention_mask=True)
        ids = np.asarray(enc["input_ids"], np.int64)
        mm = np.zeros_like(ids)
        mm[ids == self.image_token_id] = 1
        mm[ids == self.video_token_id] = 2
        expected = {1: sum(len(r) for r in replacements["image"]) // len(self.image_token),
                    2: sum(r.count(self.video_token) for r in replacements["video"])}
        for kind, n in expected.items():
            if int((mm == kind).sum()) != int(n):  # e.g. a tokenizer that splits the pad tokens
                raise ValueError(f"tokenized text has {(mm == kind).sum()} visual tokens of kind {kind}, "
                                 f"the vision inputs need {n}")
        return {"input_ids": ids, "attention_mask": np.asarray(enc["attention_mask"], np.int64),
                "mm_token_type_ids": mm, **out}
