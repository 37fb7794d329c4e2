"""One mapping table drives both conversion directions (diffusers <-> wfm_jax).

A table is a list of `Rule`s. Each rule pairs one diffusers tensor key with one wfm_jax state path
and names a layout transform; `to_jax` and `to_diffusers` walk the same table, so export can never
drift from import. The functions here are pure numpy: no model, no device, no training.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from wfm_jax.core.errors import UserError


def _linear_to_jax(w):  # torch Linear (out, in) -> flax kernel (in, out)
    return np.ascontiguousarray(np.swapaxes(w, 0, 1))


def _conv_to_jax(w):  # torch Conv OI[D]HW -> flax [D]HWIO
    return np.ascontiguousarray(np.moveaxis(w, (0, 1), (-1, -2)))


def _conv_to_torch(w):  # flax [D]HWIO -> torch OI[D]HW
    return np.ascontiguousarray(np.moveaxis(w, (-1, -2), (0, 1)))


def _channels(w):  # a per-channel vector stored broadcastable, (C, 1, 1[, 1]) -> (C,)
    return np.ascontiguousarray(np.reshape(w, (-1,)))


# name -> (diffusers -> jax, jax -> diffusers). Every transform is an exact layout permutation or
# reshape, so a round trip is bit-identical in any dtype.
TRANSFORMS: dict[str, tuple[Callable, Callable]] = {
    "identity": (lambda w: w, lambda w: w),
    "linear": (_linear_to_jax, _linear_to_jax),
    "conv": (_conv_to_jax, _conv_to_torch),
    # channel vectors that torch broadcasts over NCTHW ("3d") or NCHW ("2d") tensors
    "channels_3d": (_channels, lambda w: np.reshape(w, (-1, 1, 1, 1))),
    "channels_2d": (_channels, lambda w: np.reshape(w, (-1, 1, 1))),
}


@dataclasses.dataclass(frozen=True)
class Rule:
    jax: str  # dotted wfm_jax state path, e.g. "transformer_blocks.0.attn.to_q.kernel"
    hf: str  # diffusers/transformers key, e.g. "transformer_blocks.0.attn.to_q.weight"
    transform: str = "identity"


class ConversionError(UserError, ValueError):
    """A checkpoint does not match the model: names the offending keys."""


def linear(jax_prefix: str, hf_prefix: str, bias: bool = True) -> list[Rule]:
    rules = [Rule(f"{jax_prefix}.kernel", f"{hf_prefix}.weight", "linear")]
    if bias:
        rules.append(Rule(f"{jax_prefix}.bias", f"{hf_prefix}.bias"))
    return rules


def conv(jax_prefix: str, hf_prefix: str, bias: bool = True) -> list[Rule]:
    rules = [Rule(f"{jax_prefix}.kernel", f"{hf_prefix}.weight", "conv")]
    if bias:
        rules.append(Rule(f"{jax_prefix}.bias", f"{hf_prefix}.bias"))
    return rules


def norm(jax_prefix: str, hf_prefix: str, bias: bool = True) -> list[Rule]:
    rules = [Rule(f"{jax_prefix}.scale", f"{hf_prefix}.weight")]
    if bias:
        rules.append(Rule(f"{jax_prefix}.bias", f"{hf_prefix}.bias"))
    return rules


def _preview(keys: Iterable[str], n: int = 8) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def check_keys(table: list[Rule], hf_keys: Iterable[str]) -> None:
    """Raise unless the checkpoint's keys are exactly the table's diffusers keys."""
    want = {r.hf for r in table}
    have = set(hf_keys)
    problems = []
    if want - have:
        problems.append(f"missing keys: {_preview(want - have)}")
    if have - want:
        problems.append(f"unexpected keys: {_preview(have - want)}")
    if problems:
        raise ConversionError("; ".join(problems))


def to_jax_tensor(rule: Rule, hf_tensor: np.ndarray, expected_shape=None) -> np.ndarray:
    out = TRANSFORMS[rule.transform][0](hf_tensor)
    if expected_shape is not None and tuple(out.shape) != tuple(expected_shape):
        raise ConversionError(
            f"wrong shape for {rule.hf}: checkpoint gives {tuple(out.shape)} for {rule.jax}, "
            f"the model expects {tuple(expected_shape)}")
    return out


def to_diffusers_tensor(rule: Rule, jax_tensor: np.ndarray) -> np.ndarray:
    return TRANSFORMS[rule.transform][1](np.asarray(jax_tensor))


def convert_to_jax(table: list[Rule], hf: Mapping[str, Callable[[], np.ndarray]],
                   expected_shapes: Mapping[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """hf maps diffusers key -> zero-arg loader (tensors are read one at a time)."""
    check_keys(table, hf.keys())
    if expected_shapes is not None:
        extra = set(expected_shapes) - {r.jax for r in table}
        if extra:
            raise ConversionError(f"model parameters with no mapping: {_preview(extra)}")
    return {r.jax: to_jax_tensor(r, hf[r.hf](), None if expected_shapes is None
                                 else expected_shapes[r.jax]) for r in table}


def convert_to_diffusers(table: list[Rule], jax_flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    want = {r.jax for r in table}
    have = set(jax_flat)
    if want != have:
        parts = []
        if want - have:
            parts.append(f"state lacks: {_preview(want - have)}")
        if have - want:
            parts.append(f"state has unmapped: {_preview(have - want)}")
        raise ConversionError("; ".join(parts))
    return {r.hf: to_diffusers_tensor(r, jax_flat[r.jax]) for r in table}
