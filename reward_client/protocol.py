"""Wire format of the cosmos-rl reward protocol (see shared/specs/reward_protocol.md).

Enqueue body: UTF-8 JSON header, one b"\\n", then the bytes of an ``np.save`` file.
Pull answer: JSON ``{"scores": {key: [float, ...]}, "input_info", "duration", "decoded_duration", "type"}``.
Pure functions only: no HTTP here.

media_type "text" (a wfm_jax extension for language-model rewards; cosmos-rl scores those
in-process): the payload is a 1-D ``np.save`` array of unicode strings, one completion per sample
(dtype ``<U...``, saved without pickle); reference answers go in the header's ``references`` list.
"""
from __future__ import annotations

import io
import json
from typing import Any, Mapping

import numpy as np

from reward_client.errors import RewardProtocolError, RewardServiceError

ENQUEUE_PATH = "/api/reward/enqueue"
PULL_PATH = "/api/reward/pull"
PING_PATH = "/api/reward/ping"
# cosmos-rl's hosted services route pulls to the replica that took the enqueue through this header.
REPLICA_HEADER = "X-Lepton-Replica-Target"
MEDIA_TYPES = ("image", "video", "latent", "text")
RESERVED_HEADER_KEYS = ("prompts", "reward_fn", "media_type")
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"  # torch.save (and np.savez) write zip archives


def infer_media_type(media: np.ndarray) -> str:
    """uint8 [B,H,W,C] is an image batch, uint8 [B,C,T,H,W] a video batch, str [B] text."""
    if media.ndim == 1 and media.dtype.kind == "U":
        return "text"
    if media.ndim == 4:
        return "image"
    if media.ndim == 5:
        return "video"
    raise RewardProtocolError(
        f"media of shape {tuple(media.shape)}: expected images [B,H,W,C], videos [B,C,T,H,W] "
        "or text completions [B] (strings)")


def text_media(completions) -> np.ndarray:
    """Completions (a sequence of str) as the text payload: a 1-D unicode array."""
    if isinstance(completions, str):
        raise RewardProtocolError("text media must be a list of completions, got one string")
    items = list(completions)
    bad = [i for i, c in enumerate(items) if not isinstance(c, str)]
    if bad:
        raise RewardProtocolError(f"text media must be strings; samples {bad[:8]} are not")
    return np.asarray(items, dtype=str).reshape(len(items))


def check_media(media: np.ndarray, media_type: str) -> None:
    if media_type not in MEDIA_TYPES:
        raise RewardProtocolError(f"media_type {media_type!r}: expected one of {MEDIA_TYPES}")
    if media_type == "latent":  # cosmos-rl: float16 Wan2.1 latents, normalised as its DiT sees them
        if not np.issubdtype(media.dtype, np.floating) or media.ndim != 5:
            raise RewardProtocolError(f"latent media must be float VAE latents [B,C,T,H,W], got "
                                      f"dtype {media.dtype} shape {tuple(media.shape)}")
        return
    if media_type == "text":
        if media.dtype.kind != "U" or media.ndim != 1:
            raise RewardProtocolError(f"text media must be a 1-D array of strings [B], got dtype "
                                      f"{media.dtype} shape {tuple(media.shape)}")
        return
    want = 4 if media_type == "image" else 5
    layout = "[B,H,W,C]" if media_type == "image" else "[B,C,T,H,W]"
    if media.dtype != np.uint8:
        raise RewardProtocolError(f"{media_type} media must be uint8 {layout}, got dtype {media.dtype}")
    if media.ndim != want:
        raise RewardProtocolError(
            f"{media_type} media must be uint8 {layout}, got shape {tuple(media.shape)}")


def build_header(prompts, reward_weights: Mapping[str, float], media_type: str,
                 extras: Mapping[str, Any] | None = None) -> dict:
    header = {"prompts": [str(p) for p in prompts],
              "reward_fn": {str(k): float(v) for k, v in reward_weights.items()},
              "media_type": media_type}
    for key, value in (extras or {}).items():
        if key in RESERVED_HEADER_KEYS:
            raise RewardProtocolError(f"extras key {key!r} is reserved by the protocol")
        header[key] = value
    return header


def encode_npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def encode_enqueue(header: Mapping[str, Any], media: np.ndarray) -> bytes:
    """JSON header + b"\\n" + .npy bytes. The header is compact JSON, so it holds no raw newline."""
    try:
        head = json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise RewardProtocolError(f"enqueue header is not plain JSON: {exc}") from None
    return head + b"\n" + encode_npy(media)


def _import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _load_torch(payload: bytes) -> np.ndarray:
    torch = _import_torch()
    if torch is None:
        raise RewardProtocolError("enqueue payload is a torch.save archive and this server has no torch "
                                  "to read it: send np.save bytes (np.save(buf, array, allow_pickle=False))")
    try:  # weights_only: tensors and plain containers, never arbitrary pickled code
        obj = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise RewardProtocolError(f"enqueue payload is a zip archive but not a torch.save tensor "
                                  f"(np.savez is not accepted either): {exc}") from None
    if not isinstance(obj, torch.Tensor):
        raise RewardProtocolError(f"enqueue payload is a torch.save of {type(obj).__name__}, "
                                  "expected one tensor")
    if obj.dtype == torch.bfloat16:  # numpy has no bfloat16
        obj = obj.float()
    return obj.detach().cpu().numpy()


def load_media(payload: bytes) -> np.ndarray:
    """The media array of an enqueue body: np.save bytes (the protocol), or a torch.save tensor
    (cosmos-rl's video example sends one) when torch is installed. Anything else is a
    RewardProtocolError, so the server answers 4xx instead of failing later with a 5xx."""
    if payload.startswith(ZIP_MAGIC):
        return _load_torch(payload)
    try:
        media = np.load(io.BytesIO(payload), allow_pickle=False)
    except Exception as exc:  # np.load raises several types on bad bytes
        raise RewardProtocolError(f"enqueue payload is not a .npy array: {exc}") from None
    if not isinstance(media, np.ndarray):
        raise RewardProtocolError(f"enqueue payload is a {type(media).__name__}, expected one np.save array")
    return media


def bfloat16_from_bytes(media: np.ndarray) -> np.ndarray:
    """uint8 latents are bfloat16 bytes (numpy has no bfloat16; cosmos-rl's service reads a uint8
    latent payload this way): [..., 2W] uint8 -> [..., W] float32."""
    import ml_dtypes

    if media.ndim == 0 or media.shape[-1] % 2:
        raise RewardProtocolError(f"uint8 latent payload of shape {tuple(media.shape)} is not "
                                  "bfloat16 bytes (the last axis must be even)")
    return np.ascontiguousarray(media).view(ml_dtypes.bfloat16).astype(np.float32)


def decode_enqueue(body: bytes) -> tuple[dict, np.ndarray]:
    """Inverse of encode_enqueue, with the checks a server needs before queueing the work."""
    cut = body.find(b"\n")
    if cut < 0:
        raise RewardProtocolError("enqueue body has no newline between the JSON header and the .npy bytes")
    try:
        header = json.loads(body[:cut].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RewardProtocolError(f"enqueue header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise RewardProtocolError("enqueue header must be a JSON object")
    media = load_media(body[cut + 1:])
    prompts = header.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise RewardProtocolError("enqueue header field 'prompts' must be a list of strings")
    weights = header.get("reward_fn")
    if not isinstance(weights, dict) or not weights:
        raise RewardProtocolError("enqueue header field 'reward_fn' must be a non-empty object {name: weight}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise RewardProtocolError(f"enqueue header reward_fn[{name!r}] must be a number")
    media_type = header.get("media_type")
    if not media_type:
        # cosmos-rl's service decodes a payload without media_type as VAE latents; guessing
        # "image" here would hide that from a client tested against this server.
        raise RewardProtocolError("enqueue header has no 'media_type': set it to 'image' or 'video' "
                                  "(cosmos-rl's service treats a missing media_type as latents)")
    if media_type == "latent" and media.dtype == np.uint8:
        media = bfloat16_from_bytes(media)
    check_media(media, media_type)
    if len(prompts) != media.shape[0]:
        raise RewardProtocolError(
            f"enqueue header has {len(prompts)} prompts for a batch of {media.shape[0]}")
    header["media_type"] = media_type
    return header, media


def _json_object(content: bytes, what: str) -> dict:
    try:
        obj = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        snippet = content[:80].decode("utf-8", "replace")
        raise RewardProtocolError(f"{what}: answer is not JSON: {snippet!r}") from None
    if not isinstance(obj, dict):
        raise RewardProtocolError(f"{what}: answer is not a JSON object")
    return obj


def parse_enqueue_response(content: bytes) -> tuple[str, str | None]:
    """-> (uuid, replica_id or None)."""
    obj = _json_object(content, "enqueue")
    uuid = obj.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise RewardProtocolError(f"enqueue: answer has no 'uuid' (keys: {sorted(obj)})")
    replica = obj.get("replica_id")
    return uuid, (str(replica) if replica else None)


def parse_pull_response(content: bytes, reward_name: str, uuid: str) -> dict[str, list]:
    """-> the 'scores' object. A service-reported error is final; a malformed answer is a protocol error."""
    what = f"pull of reward {reward_name!r} for uuid {uuid}"
    obj = _json_object(content, what)
    scores = obj.get("scores")
    if scores is None and obj.get("error"):
        raise RewardServiceError(f"{what}: the service reports: {obj['error']}")
    if not isinstance(scores, dict):
        raise RewardProtocolError(f"{what}: answer has no 'scores' object (keys: {sorted(obj)})")
    return flatten_scores(scores)


def flatten_scores(scores: Mapping[str, Any]) -> dict[str, list]:
    """Per-sample lists of a 'scores' object, nested dicts flattened to dotted keys.

    cosmos-rl's gen_eval answers ``{"gen_eval_reward": [...], "gen_eval_group": {"counting": [...]}}``;
    its per-tag lists become ``"gen_eval_group.counting"``, usable as score_key and listed in
    errors. Values that are not lists (strings, numbers) carry no per-sample score and are
    dropped. A list's contents are checked only when a score_key selects it."""
    out: dict[str, list] = {}
    for key, values in scores.items():
        if isinstance(values, list):
            out[str(key)] = values
        elif isinstance(values, Mapping):
            out.update({f"{key}.{k}": v for k, v in flatten_scores(values).items()})
    return out


def prompt_extras(metadata) -> dict | None:
    """Enqueue extras for a batch's prompt metadata (the JSON objects of a .jsonl prompt file).

    The whole objects travel under ``metadata`` (local rewards read them there); when every row
    is a geneval record (``tag`` and ``include``), also the per-sample lists that cosmos-rl's
    gen_eval reward reads: ``geneval_tags``, ``geneval_includes`` (and ``geneval_excludes``)."""
    metadata = [dict(m or {}) for m in metadata]
    if not any(metadata):
        return None
    extras: dict[str, Any] = {"metadata": metadata}
    if all("tag" in m and "include" in m for m in metadata):
        extras["geneval_tags"] = [m["tag"] for m in metadata]
        extras["geneval_includes"] = [m["include"] for m in metadata]
        if any("exclude" in m for m in metadata):
            extras["geneval_excludes"] = [m.get("exclude", []) for m in metadata]
    return extras


def parse_form(body: bytes) -> dict[str, str]:
    """Form-encoded (or JSON) pull/ping bodies; the server uses this, avoiding a python-multipart dependency."""
    from urllib.parse import parse_qs

    text = body.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RewardProtocolError(f"request body is not valid JSON: {exc}") from None
        return {str(k): str(v) for k, v in obj.items()} if isinstance(obj, dict) else {}
    return {k: v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
