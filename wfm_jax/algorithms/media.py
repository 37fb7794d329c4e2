"""One rollout chunk's data items as the algorithms read them: VAE latents (DDRL's data term)
and, when max_num_conditional_frames > 0, the family's video condition (the first n latent
frames of each item's clip). The clip window and n are fixed by (seed, step, item), so a
resumed run draws the same, and every rollout of one item (one group) gets the same condition:
its rollouts are compared with each other."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np


class ItemMedia:
    """One rollout chunk's data items -> {"data_x0": latents, "cond": video condition}.
    config: a base.MediaConfig; ctx: a base.RolloutContext."""

    def __init__(self, config: Any):
        self.seed = int(config.seed)
        self.size_hw = tuple(int(v) for v in config.size)
        self.frames = int(config.frames)  # video data: the window's length
        self.cond_frames = tuple(int(v) for v in config.cond_frames)
        self.vae_key = jax.random.key(self.seed + 7)
        self._encoder: Any = None  # ctx.visual_encoder(), set by prepare

    @property
    def conditions(self) -> bool:
        return self.cond_frames[1] > 0

    def prepare(self, ctx: Any) -> None:
        """Once per run: the VAE encoder, its output split over the batch like the rollouts."""
        self._encoder = ctx.visual_encoder()

    def conditional_frame_counts(self, step: int, index) -> np.ndarray:
        """(rows,) int32: each item's number of conditional latent frames, uniform in
        [min_num_conditional_frames, max_num_conditional_frames], fixed by (seed, step, item)
        so a resumed run draws the same."""
        lo, hi = self.cond_frames
        return np.asarray([np.random.default_rng((self.seed, step, int(i), 1)).integers(lo, hi + 1)
                           for i in np.asarray(index).tolist()], np.int32)

    def latents(self, ctx: Any, batch: dict, lo: int, hi: int):
        """Normalised latents of rows lo:hi's items (one VAE draw per row from (step, item):
        a group's rows are equal)."""
        from wfm_jax.data.webdataset import load_record_media
        records, index = batch["records"][lo:hi], np.asarray(batch["index"][lo:hi])
        step, loaded = int(batch["step"]), {}
        for i, r in zip(index.tolist(), records, strict=True):
            if i not in loaded:  # a clip's window: fixed by (seed, step, item), so resumable
                rng = np.random.default_rng((self.seed, step, i)) if r.is_video else None
                loaded[i] = load_record_media(r, self.size_hw, self.frames, rng)
        pixels = np.stack([loaded[i] for i in index.tolist()])
        pixels, ids = ctx.place((pixels, index.astype(np.int32)))
        return self._encoder(pixels, jax.random.fold_in(self.vae_key, step), ids)

    def inputs(self, ctx: Any, batch: dict, lo: int, hi: int, keep_latents: bool) -> dict:
        """{"data_x0": latents (keep_latents), "cond": the video condition (max > 0)}."""
        x0 = self.latents(ctx, batch, lo, hi)
        out = {"data_x0": x0} if keep_latents else {}
        if self.conditions:
            counts = self.conditional_frame_counts(int(batch["step"]),
                                                   np.asarray(batch["index"][lo:hi]))
            out["cond"] = ctx.pipe.video_condition(x0, ctx.place(counts))
        return out
