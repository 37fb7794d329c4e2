"""SFT's encode cache (train.train_policy.cache_encodings): the text conditioning of each
distinct prompt and the VAE posterior (mean, std) of each distinct item, kept in host memory,
so the text encoders and the VAE encoder run once per prompt / item instead of every step.

Each step still draws its latents from the cached posterior with the step's key and the rows'
ids (encode.VisualEncoder.draw), so a cached run's latents are the uncached run's draws. Misses
are encoded by the same jits on a batch of the same shape (no new compile); the cached rows are
those rows. Items are keyed by a digest of their pixels: a new video window or an augmentation
is a miss (a new entry), never a stale hit. The cache is per process (its own rows); with
several processes all of them run the encoder whenever any one has a miss (a jit is
collective), agreed by one small all-gather per step.
"""
from __future__ import annotations

import hashlib

import jax
import numpy as np


def local_rows(x: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded global array, in the order it gave them."""
    if jax.process_count() == 1:
        return np.asarray(x)
    shards = {s.index[0].start or 0: s for s in x.addressable_shards}  # replicas: one kept
    return np.concatenate([np.asarray(shards[k].data) for k in sorted(shards)])


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is true on any (one all-gather; free with one process)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(np.any(multihost_utils.process_allgather(np.asarray([flag], np.int32))))


def item_key(pixels: np.ndarray) -> bytes:
    """A row's identity: 128-bit digest of its pixel bytes, shape and dtype."""
    h = hashlib.blake2b(pixels.tobytes(), digest_size=16)
    h.update(repr((pixels.shape, pixels.dtype.str)).encode())
    return h.digest()


class EncodeCache:
    """prepare()'s encoders behind host dicts; `text_calls` / `posterior_calls` count the
    encoder jits run, `prompts` / `items` the entries (what a count test reads)."""

    def __init__(self, setup, text, visual):
        self.setup, self.text, self.visual = setup, text, visual
        self.prompts: dict[str, dict[str, np.ndarray]] = {}
        self.items: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self.text_calls = self.posterior_calls = 0

    def cond(self, prompts: list[str]) -> dict:
        """The batch's conditioning (global arrays), from the cache; misses encoded first."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self.prompts]
        if any_process(bool(missing)):
            fill = missing + list(prompts[len(missing):])  # the batch's shape: no new compile
            out = self.text(self.setup.global_batch(self.text.tokenize(fill)))
            self.text_calls += 1
            host = {k: local_rows(v) for k, v in out.items()}
            for i, p in enumerate(missing):
                self.prompts[p] = {k: v[i] for k, v in host.items()}
        return self.setup.global_batch(
            {k: np.stack([self.prompts[p][k] for p in prompts]) for k in self.prompts[prompts[0]]})

    def latents(self, pixels: np.ndarray, key, ids):
        """The batch's latents: this step's draw (key, ids) from each row's cached posterior."""
        keys = [item_key(row) for row in pixels]
        missing = {k: i for i, k in enumerate(keys) if k not in self.items}
        if any_process(bool(missing)):
            mean, std = self.visual.posterior(self.setup.global_batch(pixels))
            self.posterior_calls += 1
            mean, std = local_rows(mean), local_rows(std)
            for k, i in missing.items():
                self.items[k] = (mean[i], std[i])
        mean, std = (np.stack([self.items[k][j] for k in keys]) for j in (0, 1))
        mean, std = self.setup.global_batch((mean, std))
        return self.visual.draw(mean, std, key, ids)
