"""Tied weights stored under two keys: fold them into the one key the mapping table names.

transformers ties some tensors (T5's `encoder.embed_tokens.weight` is `shared.weight`) and saves
one key; other writers store both, or only the copy. A checkpoint may hold the table's key, its
copy, or both with equal values. Both with different values is an error: the model has one
tensor, and silently picking one would load a model that is not the checkpoint.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from converters.table import ConversionError


@dataclasses.dataclass(frozen=True)
class StoredKeys:
    meta: dict  # table key -> (shape, dtype): what the checks see, copies folded in
    stored_as: dict  # table key -> the key that holds it in the files (the copy when it alone is)
    twins: dict  # table key -> its copy stored beside it (values must be equal)


def resolve_tied(meta: Mapping[str, tuple], tied: tuple[tuple[str, str], ...]) -> StoredKeys:
    """meta: checkpoint key -> (shape, dtype) from the headers; tied: (copy key, table key) pairs.

    Header-level only (nothing is read): a copy whose shape or dtype differs from its table key
    is an error naming both keys.
    """
    meta = dict(meta)
    stored_as = {k: k for k in meta}
    twins = {}
    for copy, source in tied:
        if copy not in meta:
            continue
        if source not in meta:  # only the copy was stored: it is the tensor
            meta[source] = meta.pop(copy)
            stored_as[source] = stored_as.pop(copy)
            continue
        if tuple(meta[copy][0]) != tuple(meta[source][0]) or meta[copy][1] != meta[source][1]:
            raise ConversionError(
                f"tied keys {source} {tuple(meta[source][0])} {meta[source][1]} and {copy} "
                f"{tuple(meta[copy][0])} {meta[copy][1]} differ in shape or dtype; the model "
                f"holds one tensor for both")
        del meta[copy], stored_as[copy]
        twins[source] = copy
    return StoredKeys(meta, stored_as, twins)


def check_equal(source: str, copy: str, a: np.ndarray, b: np.ndarray) -> None:
    """Bitwise: a tied copy must be the same tensor, not merely close."""
    if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
        raise ConversionError(
            f"tied keys {source} and {copy} hold different values; the model holds one tensor "
            f"for both (drop one key from the checkpoint to choose)")


def tied_reader(keys: StoredKeys, readers: Mapping[str, Callable], key: str) -> Callable:
    """The reader of table key `key`: reads what holds it and, for twins, checks the copy holds
    the same values over the same index (so a slice-reading process checks its own slices)."""
    read = readers[keys.stored_as[key]]
    copy = keys.twins.get(key)
    if copy is None:
        return read

    def read_checked(*index):
        a = read(*index)
        check_equal(key, copy, a, readers[copy](*index))
        return a

    return read_checked
