"""The data items an RL algorithm reads besides prompts: DDRL's data term, and video2world
rollouts of NFT, Flow-GRPO and DDRL (cosmos-rl's world-model stack conditions on frames of the
dataset's videos).

`media_records(config)` reads a dataset with media (paired dir or shards, or the WFM layout);
`ItemMedia` turns one rollout chunk's items into VAE latents and, when
policy.diffusers.max_num_conditional_frames > 0, the family's video condition (the first n
latent frames of each item's clip). The clip window and n are fixed by (seed, step, item), so a
resumed run draws the same, and every rollout of one item (one group) gets the same condition:
its rollouts are compared with each other.
"""
from __future__ import annotations

import os

import jax
import numpy as np

from wfm_jax.data.errors import DataError


def scan_records(location: str, allow_pickle: bool = False) -> list:
    """The records of a dataset in any layout the RL data readers take: paired shards (local or
    s3://), a paired dir (images or videos), or a WFM dir (metas/ + videos/)."""
    from wfm_jax.data.paired import scan_paired
    from wfm_jax.data.webdataset import index_records, is_webdataset
    from wfm_jax.data.wfm import scan_wfm
    if is_webdataset(location):
        return index_records(location)
    if os.path.isdir(os.path.join(location, "metas")):
        return scan_wfm(location, allow_pickle)
    return scan_paired(location)


def uses_video_condition(config) -> bool:
    return int(config.policy.diffusers.max_num_conditional_frames) > 0


def media_records(config) -> tuple[list, list]:
    """(train, validation) records of the dataset (paired layout, local or in shards, or the
    WFM layout: images or videos, as the recipe's model takes); validation: a held-out
    fraction, or validation.dataset.local_dir (a dataset dir or a prompt file)."""
    from wfm_jax.data.prompts import holdout_split, read_prompt_file
    from wfm_jax.train import setup as train_setup
    ds, d = config.train.train_policy.dataset, config.policy.diffusers
    if os.path.isfile(ds.local_dir):
        raise DataError(f"train.train_policy.dataset.local_dir = {ds.local_dir!r} is a prompt "
                        f"file, but this recipe reads data items with media (DDRL's data term, "
                        f"or max_num_conditional_frames > 0: frames of the dataset's videos)")
    if ds.build_tiny and ds.local_dir:
        from wfm_jax.worlds.shapes.dataset import ensure_shapes_dataset
        frames = int(d.train_frames) if d.is_video else 0
        train_setup._primary_builds(
            ds.local_dir, lambda p: ensure_shapes_dataset(p, frames=frames),
            "the tiny shapes dataset (train.train_policy.dataset.build_tiny)")
    records = scan_records(ds.local_dir, bool(ds.allow_pickle))
    if bool(records[0].is_video) != bool(d.is_video):
        raise DataError(f"{ds.local_dir} holds {'videos' if records[0].is_video else 'images'}"
                        f" but the recipe's {config.policy.family} model takes "
                        f"{'videos' if d.is_video else 'images'} (policy.diffusers.is_video)")
    val = config.validation.dataset
    if val.local_dir:
        return records, (scan_records(val.local_dir, bool(ds.allow_pickle))
                         if os.path.isdir(val.local_dir) else read_prompt_file(val.local_dir))
    if val.holdout_fraction > 0:
        return holdout_split(records, val.holdout_fraction, int(config.train.seed))
    return records, []


class ItemMedia:
    """One rollout chunk's data items -> {"data_x0": latents, "cond": video condition}."""

    def __init__(self, config):
        d = config.policy.diffusers
        self.seed = int(config.train.seed)
        self.size_hw = tuple(int(v) for v in d.inference_size)
        self.frames = int(d.train_frames)  # video data: the window's length
        self.cond_frames = (int(d.min_num_conditional_frames), int(d.max_num_conditional_frames))
        self.vae_key = jax.random.key(self.seed + 7)
        self._encoder = None

    @property
    def conditions(self) -> bool:
        return self.cond_frames[1] > 0

    def prepare(self, run) -> None:
        """Once per run: the VAE encoder, its output split over the batch like the rollouts."""
        from wfm_jax.programs.encode import VisualEncoder
        self._encoder = VisualEncoder(run.setup.pipe, out_sharding=run.setup.batch_sharding())

    def conditional_frame_counts(self, step: int, index) -> np.ndarray:
        """(rows,) int32: each item's number of conditional latent frames, uniform in
        [min_num_conditional_frames, max_num_conditional_frames], fixed by (seed, step, item)
        so a resumed run draws the same."""
        lo, hi = self.cond_frames
        return np.asarray([np.random.default_rng((self.seed, step, int(i), 1)).integers(lo, hi + 1)
                           for i in np.asarray(index).tolist()], np.int32)

    def latents(self, run, batch: dict, lo: int, hi: int):
        """Normalised latents of rows lo:hi's items (one VAE draw per row from (step, item):
        a group's rows are equal)."""
        from wfm_jax.data.webdataset import load_record_media
        records, index = batch["records"][lo:hi], np.asarray(batch["index"][lo:hi])
        step, loaded = int(batch["step"]), {}
        for i, r in zip(index.tolist(), records):
            if i not in loaded:  # a clip's window: fixed by (seed, step, item), so resumable
                rng = np.random.default_rng((self.seed, step, i)) if r.is_video else None
                loaded[i] = load_record_media(r, self.size_hw, self.frames, rng)
        pixels = np.stack([loaded[i] for i in index.tolist()])
        pixels, ids = run.setup.global_batch((pixels, index.astype(np.int32)))
        return self._encoder(pixels, jax.random.fold_in(self.vae_key, step), ids)

    def inputs(self, run, batch: dict, lo: int, hi: int, keep_latents: bool) -> dict:
        """{"data_x0": latents (keep_latents), "cond": the video condition (max > 0)}."""
        x0 = self.latents(run, batch, lo, hi)
        out = {"data_x0": x0} if keep_latents else {}
        if self.conditions:
            counts = self.conditional_frame_counts(int(batch["step"]),
                                                   np.asarray(batch["index"][lo:hi]))
            out["cond"] = run.setup.pipe.video_condition(x0, run.setup.global_batch(counts))
        return out
