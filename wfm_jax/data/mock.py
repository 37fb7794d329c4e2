"""cosmos-rl's mock-data mode (spec cosmos_rl_wfm.md §3): random videos and random T5-like
text embeddings of the recipe's shapes, no dataset.

cosmos-rl's `get_mock_video_dataset` gives per sample a uint8 video uniform in [0, 255) of
[3, num_video_frames, H, W] (H, W from the resolution: "480" -> 432 x 768), `t5_text_embeddings`
N(0, 1) of [len_t5, t5_dim] and the caption "placeholder". Here (train.train_policy.dataset.layout
"mock"):
- `records(config)`: one MockRecord per data item the run draws (every step new items, as
  cosmos-rl's endless mock loader); a record's video is drawn from the rng the RL data reader
  passes (fixed by (seed, step, item), so a resumed run sees the same).
- `MockTextEncoder`: stands in for the text encoder; an item's embedding is N(0, 1) from
  (seed, item), its caption "placeholder <item>" (the item number keeps the groups' prompts
  apart). The negative (CFG) branch is zeros, as cosmos-rl's dropped text. Width: the DiT's text
  input width; when the recipe's t5_dim differs (the released DiT takes Reason1 embeddings through
  crossattn_proj, the tiny twin a narrow one), that width is used and said once.
"""
from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.data.errors import DataError

PREFIX = "placeholder "


@dataclasses.dataclass(frozen=True)
class MockRecord:
    index: int
    is_video: bool = True

    @property
    def prompt(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def name(self) -> str:
        return f"mock_{self.index:06d}"

    @property
    def media_path(self) -> str:
        return f"mock://{self.index}"

    @property
    def metadata(self) -> dict:
        return {}

    def load(self, size_hw, num_frames: int, rng: np.random.Generator | None) -> np.ndarray:
        """(T, H, W, 3) uint8 uniform in [0, 255) (cosmos-rl: randint(0, 255)); an image
        record (num_frames 1 and not a video) is (H, W, 3)."""
        rng = rng if rng is not None else np.random.default_rng(self.index)
        height, width = (int(v) for v in size_hw)
        shape = (int(num_frames), height, width, 3) if self.is_video else (height, width, 3)
        return rng.integers(0, 255, size=shape, dtype=np.uint8)


def records(config) -> tuple[list[MockRecord], list]:
    """(train, validation) records: fresh items for every group of every step; no validation
    (cosmos-rl's mock mode visualises the RL batch itself)."""
    groups = max(1, int(config.train.train_batch_per_replica) // int(config.rollout.n_generation))
    if config.train.max_steps is None:  # the items are made per step: no length of their own
        raise DataError("train.train_policy.dataset.layout='mock' makes fresh items for every "
                        "step, so the run length cannot come from train.epoch: set "
                        "--config.train.max_steps=N")
    steps = max(1, int(config.train.max_steps))
    video = bool(config.policy.diffusers.is_video)
    return [MockRecord(i, video) for i in range(groups * steps)], []


def item_of(prompt: str) -> int:
    if not prompt.startswith(PREFIX):
        return -1  # a negative / empty prompt: the zero (dropped) embedding
    return int(prompt[len(PREFIX):])


class MockTextEncoder:
    """The RL run's text encoder in mock mode: prompt "placeholder <item>" -> that item's random
    embedding {COND_KEY: (B, L, D) f32}. Same interface as programs.encode.TextEncoder."""

    def __init__(self, pipe, max_sequence_length: int, recipe_dim: int, seed: int,
                 out_sharding=None, log=None):
        from wfm_jax.families.cosmos.pipeline import COND_KEY
        self.max_len, self.key = int(max_sequence_length), jax.random.key(seed + 11)
        self.dim = int(pipe.text_width)
        if self.dim != int(recipe_dim):
            (log or _say)(f"note: mock text embeddings are {self.dim} wide (the DiT's text input), "
                          f"not the recipe's t5_dim {recipe_dim}")
        shape, key = (self.max_len, self.dim), self.key

        def encode(ids):
            def one(i):
                emb = jax.random.normal(jax.random.fold_in(key, jnp.maximum(i, 0)), shape, jnp.float32)
                return jnp.where(i >= 0, emb, 0.0)
            return {COND_KEY: jax.vmap(one)(ids["item"])}

        if out_sharding is None:
            self._encode = jax.jit(encode)
        else:
            from wfm_jax.core.mesh import mesh_jit
            self._encode = mesh_jit(encode, mesh=out_sharding.mesh, out_shardings=out_sharding)

    def tokenize(self, prompts, negative: bool = False) -> dict:
        items = [-1 if negative else item_of(p) for p in prompts]
        return {"item": np.asarray(items, np.int32)}

    def __call__(self, ids: dict) -> dict:
        return self._encode(ids)


def _say(line: str) -> None:
    print(line, file=sys.stderr)
