"""OCR reward: does the image show the text quoted in the prompt?

Target = the text between the first pair of double quotes in the prompt. Recognised text = every
text line rapidocr-onnxruntime finds (its wheel carries the model weights; CPU, offline), joined.
Both are normalised (lowercase, whitespace removed). Score = 1 when the target occurs in the
recognised text, else 1 - min(Levenshtein(recognised, target), len(target)) / len(target).
Score key ``ocr_reward``, as the cosmos-rl OCR service answers.
"""
from __future__ import annotations

import threading

import numpy as np

from reward_client.errors import RewardConfigError, RewardValueError
from reward_client.registry import register_reward

_ENGINE = None
_ENGINE_LOCK = threading.Lock()


def quoted_target(prompt: str) -> str | None:
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else None


def normalise(text: str) -> str:
    return "".join(text.lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute; unit costs), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def text_score(recognised: str, target: str) -> float:
    rec, tgt = normalise(recognised), normalise(target)
    if tgt in rec:
        return 1.0
    return 1.0 - min(levenshtein(rec, tgt), len(tgt)) / len(tgt)


def _engine():
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError:
                raise RewardConfigError("the ocr reward needs rapidocr-onnxruntime: "
                                        "pip install 'wfm_jax[ocr]'") from None
            # PaddleOCR's detection default (longest side capped at 960, never upscaled), which the
            # cosmos-rl OCR service uses; rapidocr's own default upscales the short side to 736
            # (about 10x slower on 512 px images).
            _ENGINE = RapidOCR(det_limit_side_len=960, det_limit_type="max")
        return _ENGINE


def recognise(image: np.ndarray) -> str:
    engine = _engine()
    bgr = np.ascontiguousarray(image[..., ::-1]) if image.shape[-1] == 3 else image  # rapidocr follows cv2: BGR
    with _ENGINE_LOCK:  # one engine shared by threads; serialise its calls
        result, _ = engine(bgr)
    return "".join(str(line[1]) for line in (result or []))


def _targets(prompts) -> list[str]:
    targets = []
    for i, prompt in enumerate(prompts):
        target = quoted_target(prompt)
        if not target or not normalise(target):
            raise RewardValueError(f"ocr reward: prompt {i} ({prompt[:60]!r}) has no text between double quotes")
        targets.append(target)
    return targets


@register_reward("ocr", setup=_engine)
def ocr_reward(images, prompts, extras):
    targets = _targets(prompts)  # fail before the slow part
    return {"ocr_reward": np.asarray([text_score(recognise(img), tgt) for img, tgt in zip(images, targets)])}
