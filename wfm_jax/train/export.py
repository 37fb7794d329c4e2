"""Export trained weights to cosmos-rl's layout, loadable by diffusers (torch).

    output_dir/safetensors/step_N/            full fine-tune: a complete diffusers pipeline dir
                                              (DiffusionPipeline.from_pretrained(step_dir)); the
                                              unchanged components hard-linked to the source's
    output_dir/safetensors/step_N/lora/model.safetensors + adapter_config.json
                                              LoRA: pipe.load_lora_weights(step_N/lora,
                                              weight_name="model.safetensors")

Every process must call the export functions (parameters sharded over processes are gathered);
only process 0 writes. Each step dir is built under a temporary name and renamed into place, so
it is complete or absent. The weights are the EMA shadow when EMA is on (export_params). The
newest train.ckpt.export_max_keep step dirs are kept (None: as max_keep; 0: every one).
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from converters.loading import export_diffusers, host_array
from wfm_jax.core.console import say
from wfm_jax.core.tree import path_str
from wfm_jax.families.base import family_class
from wfm_jax.io.atomic import atomic_directory
from wfm_jax.models import lora as lora_lib

LORA_WEIGHT_NAME = "model.safetensors"
LORA_METADATA_KEY = "lora_adapter_metadata"  # diffusers reads the peft LoraConfig from here


def step_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, "safetensors", f"step_{int(step)}")


_STALE = re.compile(r"^\.step_\d+\.(tmp|old)-[0-9a-f]+$")  # wfm_jax.io.atomic's temporaries


def remove_stale_temporaries(output_dir: str) -> list[str]:
    """Delete the half-written `safetensors/.step_N.tmp-*` (and `.old-*`) an export killed
    mid-write left behind; call before this run exports anything. Returns what was removed."""
    root = os.path.join(output_dir, "safetensors")
    if not os.path.isdir(root):
        return []
    stale = sorted(n for n in os.listdir(root) if _STALE.match(n))
    for name in stale:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    return stale


def export_params(state) -> Any:
    """What gets exported: the EMA shadow when EMA is on, else the trained params."""
    return state.ema if state.ema is not None else state.params


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the filesystem allows (an export step shares the unchanged text
    encoders and VAE with the source instead of another copy of them; each step dir still
    stands alone, so pruning one never breaks another), else a copy. Symlinks are followed."""
    try:
        os.link(os.path.realpath(src), dst)
    except OSError:  # another filesystem, or links not supported
        shutil.copy2(src, dst)


def _copy_components(source_dir: str, dst: str, skip: Sequence[str]) -> None:
    """Link (or copy) a pipeline dir's entries except `skip`."""
    for name in sorted(os.listdir(source_dir)):
        if name in skip or name.startswith("."):
            continue
        src = os.path.join(source_dir, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dst, name), symlinks=False,
                            copy_function=_link_or_copy)
        else:
            _link_or_copy(src, os.path.join(dst, name))


def exports_kept(config) -> int | None:
    """How many step exports to keep: train.ckpt.export_max_keep, None -> max_keep, 0 -> all."""
    keep = config.train.ckpt.export_max_keep
    keep = config.train.ckpt.max_keep if keep is None else keep
    return int(keep) if keep else None


def prune_exports(output_dir: str, keep: int | None,
                  before_delete: Callable[[list[int]], None] | None = None) -> list[int]:
    """Delete all but the newest `keep` safetensors/step_N dirs (None: keep all); returns the
    removed steps. `before_delete(steps)` runs first (the S3 uploads of those steps end)."""
    root = os.path.join(output_dir, "safetensors")
    if not keep or not os.path.isdir(root):
        return []
    steps = sorted(int(n[5:]) for n in os.listdir(root) if re.fullmatch(r"step_\d+", n))
    removed = steps[:-keep]
    if removed and before_delete is not None:
        before_delete(removed)
    for step in removed:
        shutil.rmtree(step_dir(output_dir, step))
    return removed


def export_full_pipeline(transformer, transformer_config: Mapping, source_dir: str,
                         dst: str, rewritten: Sequence[str] = ("transformer",),
                         write: Callable[[Any, str], None] | None = None) -> str | None:
    """A complete diffusers pipeline dir at `dst`: the source pipeline's components copied
    unchanged except `rewritten` (the family's export_components()), the trained module
    (`transformer`, whatever the family calls it) written into `rewritten[0]` by
    `write(module, directory)` (the family's export_trainable) or, without one, as a diffusers
    model of `transformer_config` in its parameters' dtype."""
    if write is None:
        def write(module, directory):
            export_diffusers(module, transformer_config, directory)
    if jax.process_index() != 0:
        write(transformer, os.path.join(dst, rewritten[0]))
        return None
    with atomic_directory(dst) as tmp:
        _copy_components(source_dir, tmp, skip=tuple(rewritten))
        write(transformer, os.path.join(tmp, rewritten[0]))
    return dst


def lora_flat(params) -> dict[str, np.ndarray]:
    """nnx.State of LoRA params -> {"<layer>.lora_a": host array, ...} (gathered)."""
    return {path_str(p): host_array(v.get_value() if hasattr(v, "get_value") else v)
            for p, v in params.flat_state()}


def export_lora(params, adapter: Mapping, dst: str, prefix: str = "transformer") -> str | None:
    """`dst/lora/model.safetensors` (peft keys, LoraConfig in the header) + adapter_config.json."""
    from safetensors.numpy import save_file

    tensors = lora_lib.to_diffusers(lora_flat(params), prefix)
    if jax.process_index() != 0:
        return None
    metadata = {"format": "pt",
                LORA_METADATA_KEY: json.dumps({f"{prefix}.{k}": v for k, v in adapter.items()},
                                              sort_keys=True)}
    with atomic_directory(dst) as tmp:
        os.makedirs(os.path.join(tmp, "lora"))
        save_file(tensors, os.path.join(tmp, "lora", LORA_WEIGHT_NAME), metadata=metadata)
        with open(os.path.join(tmp, "lora", "adapter_config.json"), "w") as f:
            json.dump(dict(adapter), f, indent=2, sort_keys=True)
            f.write("\n")
    return dst


def export_step(setup, step: int) -> str | None:
    """Export `setup.state` (EMA when on) for `step`; returns the step dir on process 0."""
    config = setup.config
    dst = step_dir(config.train.output_dir, step)
    params = export_params(setup.state)
    family = family_class(setup.pipe.directory)  # the source pipeline's family: its layout
    if setup.lora:
        cfg = config.policy.lora
        adapter = lora_lib.adapter_config(cfg.r, cfg.lora_alpha, cfg.target_modules,
                                          cfg.init_lora_weights)
        written = export_lora(params, adapter, dst, prefix=family.lora_prefix)
    else:
        written = export_full_pipeline(setup.merge(params), setup.pipe.transformer_config,
                                       setup.pipe.directory, dst,
                                       rewritten=family.export_components(),
                                       write=setup.pipe.export_trainable)
    say(f"exported step {step} to {dst}" + (" (LoRA adapter in lora/)" if setup.lora else
                                            " (diffusers pipeline)"))
    s3 = getattr(setup, "s3", None)
    if s3 is not None:
        s3.exported(step)
    if jax.process_index() == 0:
        keep = exports_kept(config)
        removed = prune_exports(config.train.output_dir, keep, before_delete=None if s3 is None
                                else functools.partial(s3.wait_uploaded, "safetensors"))
        if removed:
            say(f"removed export{'s' if len(removed) > 1 else ''} "
                f"{', '.join(f'step_{s}' for s in removed)} (train.ckpt.export_max_keep: keep "
                f"{keep}; 0 keeps every export)")
    return written
