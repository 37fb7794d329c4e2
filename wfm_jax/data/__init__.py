"""Data pipelines (grain): SFT paired media, the WFM video layout, RL prompt files and groups.

Entry points for trainers:
- `sft_loader_from_config(config)`: batches of {"pixels", "prompt"[, "text_embedding"]} for
  train.train_policy.dataset.layout "paired" or "wfm", or WebDataset tar shards (local or s3://,
  data/webdataset.py) when dataset.local_dir holds them; `.state()` / `.restore()` for checkpoints.
- `prompt_splits_from_config(config)` -> (train, validation) prompt records;
  `group_batcher_from_config(config, train)` -> RL batches of n_generation-sized groups;
  `eval_batches(validation, batch)` for validation passes.
"""
from wfm_jax.data.errors import BadSample, DataError
from wfm_jax.data.groups import GroupBatcher, eval_batches, group_batcher_from_config
from wfm_jax.data.loader import Loader, Shard, local_batch_size, process_shard
from wfm_jax.data.paired import paired_loader, paired_loader_from_config
from wfm_jax.data.prompts import PromptRecord, prompt_splits, prompt_splits_from_config, read_prompt_file
from wfm_jax.data.wfm import wfm_loader, wfm_loader_from_config

__all__ = ["BadSample", "DataError", "GroupBatcher", "Loader", "PromptRecord", "Shard", "eval_batches",
           "group_batcher_from_config", "local_batch_size", "paired_loader", "paired_loader_from_config",
           "process_shard", "prompt_splits", "prompt_splits_from_config", "read_prompt_file",
           "sft_loader_from_config", "wfm_loader", "wfm_loader_from_config"]


def sft_loader_from_config(config, shard: Shard | None = None) -> Loader:
    layout = config.train.train_policy.dataset.layout
    from wfm_jax.data.webdataset import is_webdataset, webdataset_loader_from_config
    if layout in ("paired", "wfm") and is_webdataset(config.train.train_policy.dataset.local_dir):
        return webdataset_loader_from_config(config, shard)
    if layout == "paired":
        return paired_loader_from_config(config, shard)
    if layout == "wfm":
        return wfm_loader_from_config(config, shard)
    raise DataError(f"train.train_policy.dataset.layout='{layout}' is not a media layout "
                    f"(use 'paired' or 'wfm')")
