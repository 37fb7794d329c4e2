"""The data items an RL algorithm reads besides prompts: DDRL's data term, and video2world
rollouts of NFT, Flow-GRPO and DDRL (cosmos-rl's world-model stack conditions on frames of the
dataset's videos). `media_records(config)` reads a dataset with media (paired dir or shards, or
the WFM layout); algorithms.media.ItemMedia turns a rollout chunk's items into latents.
`primary_builds`: process 0 builds a missing tiny asset, every process waits for it
(`ensure_tiny_dataset`: the tiny shapes dataset).
"""
from __future__ import annotations

import os

import jax

from wfm_jax.core.console import say
from wfm_jax.data.errors import DataError


def primary_builds(path: str, build, what: str) -> None:
    """Process 0 builds `path` if it is missing (saying so: it is random, not a trained model
    or real data); every process waits until it exists."""
    if jax.process_index() == 0 and not os.path.isdir(path):
        say(f"building {what} at {os.path.abspath(path)} (it does not exist yet)")
        build(path)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"build {path}")


def ensure_tiny_dataset(config) -> None:
    """train.train_policy.dataset.build_tiny: generate the tiny shapes dataset (its count, split
    and layout; video recipes: clips of as many frames as a training window) at local_dir if
    absent. A folder already there with another number of items is refused in one line: the run
    would otherwise train on data its recipe does not describe."""
    ds, d = config.train.train_policy.dataset, config.policy.diffusers
    if not (ds.build_tiny and ds.local_dir):
        return
    from wfm_jax.worlds.shapes.dataset import ensure_shapes_dataset, item_count
    frames, count = (int(d.train_frames) if d.is_video else 0), int(ds.build_tiny_count)
    primary_builds(
        ds.local_dir, lambda p: ensure_shapes_dataset(
            p, count=count, frames=frames, split=str(ds.build_tiny_split),
            layout=str(ds.build_tiny_layout)),
        "the tiny shapes dataset (train.train_policy.dataset.build_tiny)")
    found = item_count(ds.local_dir)
    if found != count:
        raise DataError(f"train.train_policy.dataset.local_dir = {ds.local_dir!r} holds {found} items "
                        f"but build_tiny_count asks {count}: remove the folder to rebuild it, or "
                        "point local_dir elsewhere")


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
    ds, d = config.train.train_policy.dataset, config.policy.diffusers
    if ds.layout == "mock":  # cosmos-rl's mock-data mode: random items, no files
        from wfm_jax.data import mock
        return mock.records(config)
    if os.path.isfile(ds.local_dir):
        raise DataError(f"train.train_policy.dataset.local_dir = {ds.local_dir!r} is a prompt "
                        f"file, but this recipe reads data items with media (DDRL's data term, "
                        f"or max_num_conditional_frames > 0: frames of the dataset's videos)")
    ensure_tiny_dataset(config)
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
