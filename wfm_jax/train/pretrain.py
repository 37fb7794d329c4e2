"""A tiny SD3 pipeline that has learned the shapes world, built in-repo and cached.

    python -m wfm_jax.tiny --pretrained DIR      (or ensure_pretrained(DIR) from code)

Stages, all inside a temporary sibling of DIR renamed into place at the end (so a build killed
midway leaves no DIR to load): (1) a base pipeline (tiny.write_pipeline: a wider 4-layer MMDiT
with DiT's adaLN-Zero init, a VAE that halves the resolution, tokenizers that keep the grammar's
words whole); (2) its VAE
fitted as an autoencoder on shapes images (tiny_vae.py); (3) the shapes dataset's train split
(held-out scenes excluded); (4) SFT of the transformer with wfm_jax's own trainer
(configs/tiny_pretrain.py); (5) the export, scored with shapes_alignment on the held-out
prompts, and a marker file `wfm_pretrain.json` (settings + scores) written last. A DIR without a
complete marker, or with other settings, is rebuilt, never loaded.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import time

import numpy as np

from wfm_jax.worlds.shapes.grammar import BACKGROUNDS, COLOURS, COUNT_WORDS, SHAPES, heldout_scenes

MARKER = "wfm_pretrain.json"
FORMAT = 2  # bump when the build changes what a cache holds
GRAMMAR_WORDS = (*COUNT_WORDS.values(), "on", "background", *COLOURS, *SHAPES,
                 *(s + "s" for s in SHAPES), *BACKGROUNDS)


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """What a cache was built with; the defaults take about 4 minutes on 2 idle CPU cores."""
    size: int = 32               # image side in pixels (latents: size / 2)
    dataset_count: int = 1200    # training images (train split: 60 scenes, 20 each)
    vae_steps: int = 400
    sft_steps: int = 1500        # 1500 x 16 beat 600 x 32: held-out 0.59 vs 0.45 (both adaLN-Zero)
    batch: int = 16
    num_layers: int = 4
    heads: int = 4
    head_dim: int = 16
    seed: int = 0
    eval_per_prompt: int = 4     # images per held-out prompt for the recorded score; 0: none


QUICK = PretrainSettings(dataset_count=48, vae_steps=2, sft_steps=2, batch=8, num_layers=1,
                         heads=2, head_dim=8, eval_per_prompt=0)  # tests: seconds, learns nothing


def base_configs(s: PretrainSettings) -> dict:
    inner = s.heads * s.head_dim
    transformer = dict(sample_size=s.size // 2, num_layers=s.num_layers, num_attention_heads=s.heads,
                       attention_head_dim=s.head_dim, caption_projection_dim=inner,
                       pos_embed_max_size=max(s.size, 32))
    vae = dict(block_out_channels=[16, 16], down_block_types=["DownEncoderBlock2D"] * 2,
               up_block_types=["UpDecoderBlock2D"] * 2, norm_num_groups=4, sample_size=s.size,
               mid_block_add_attention=False)  # attention is the VAE's cost and flat shapes need none
    return dict(transformer=transformer, vae=vae, words=GRAMMAR_WORDS, clip_max_length=16)


# adaLN modulations and the output projection start at zero (DiT's adaLN-Zero: every block
# starts as the identity and the output at 0), the init DiT/SD3 are trained from, in place of
# tiny.write_pipeline's torch-default random draw (which suits parity tests, not training). At
# the default 1500 x 16 it took the held-out count score from 0.27 to 0.57.
ZERO_INIT = ("norm1.linear.", "norm1_context.linear.", "norm_out.linear.", "proj_out.")


def zero_init_transformer(pipeline_dir: str) -> None:
    """Zero the adaLN-modulation and output weights of `pipeline_dir`/transformer in place."""
    from safetensors.numpy import load_file, save_file

    for path in glob.glob(os.path.join(pipeline_dir, "transformer", "*.safetensors")):
        tensors = load_file(path)
        tensors = {k: (np.zeros_like(v) if any(z in k for z in ZERO_INIT) else v)
                   for k, v in tensors.items()}
        save_file(tensors, path, metadata={"format": "pt"})


def read_marker(directory: str) -> dict | None:
    """The marker of a complete build, or None (absent, unreadable, or another format)."""
    try:
        with open(os.path.join(directory, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not marker.get("complete"):
        return None
    if not os.path.isfile(os.path.join(directory, "model_index.json")):
        return None
    return marker


def is_built(directory: str, settings: PretrainSettings) -> bool:
    marker = read_marker(directory)
    return marker is not None and marker.get("settings") == dataclasses.asdict(settings)


def _images(directory: str) -> np.ndarray:
    from PIL import Image
    files = sorted(glob.glob(os.path.join(directory, "*.png")))
    return np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])



def pretrain_recipe():
    """The shapes world's SFT recipe (configs/tiny_pretrain.py returns it): part of the build
    format, so it lives with the build rather than in a checkout's configs/."""
    from wfm_jax.config.schema import default_config

    c = default_config()
    c.train.output_dir = "./outputs/tiny_pretrain"
    c.train.train_policy.type = "sft"
    c.train.max_steps = 1500
    c.train.seed = 0
    c.train.param_dtype = "float32"
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 16
    c.train.optm_lr = 2e-3
    c.train.optm_weight_decay = 1e-4
    c.train.optm_warmup_steps = 20
    c.train.lr_schedule = "cosine"  # decays to 0 by the last step
    c.train.optm_grad_norm_clip = 1.0
    c.train.ema_enable = True
    c.train.ema_decay = 0.98
    c.train.log_freq = 10
    c.train.ckpt.save_freq = 100000  # only the final checkpoint: saving is slow on 2 cores
    c.train.ckpt.max_keep = 1
    # 60 prompts and 1200 fixed images: T5/CLIP and the VAE encoder run once per prompt / image
    # instead of every step (losses bit-equal to the uncached run)
    c.train.train_policy.cache_encodings = True
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_pretrain_data"
    ds.layout = "paired"
    c.policy.model_name_or_path = "./outputs/tiny_pretrain_base"
    c.policy.lora.enable = False
    d = c.policy.diffusers
    d.inference_size = (32, 32)
    d.max_prompt_length = 16
    d.weighting_scheme = "logit_normal"
    c.policy.parallelism.data = -1
    return c


def _sft_config(s: PretrainSettings, base: str, data: str, out: str):
    from wfm_jax.config.recipe import validate
    c = pretrain_recipe()
    c.policy.model_name_or_path, c.train.train_policy.dataset.local_dir = base, data
    c.train.output_dir, c.train.max_steps, c.train.seed = out, s.sft_steps, s.seed
    c.train.train_batch_per_replica = s.batch
    c.train.optm_warmup_steps = min(20, s.sft_steps // 10)
    c.policy.diffusers.inference_size = (s.size, s.size)
    return validate(c)


def build_pretrained(directory: str, settings: PretrainSettings = PretrainSettings(),
                     log=print) -> str:
    """Build the pretrained pipeline at `directory` (replacing whatever is there)."""
    from wfm_jax.io.atomic import atomic_directory
    from wfm_jax.families import tiny
    from wfm_jax.worlds.shapes.dataset import build_shapes_dataset
    from wfm_jax.worlds.shapes.vae import fit_vae
    from wfm_jax.train import sft

    s, start = settings, time.perf_counter()
    directory = os.path.abspath(directory)
    with atomic_directory(directory) as tmp:
        work = os.path.join(tmp, ".work")
        base, data, out = (os.path.join(work, n) for n in ("base", "data", "sft"))
        os.makedirs(base)
        tiny.write_pipeline(base, s.seed, **base_configs(s))
        zero_init_transformer(base)
        build_shapes_dataset(data, count=s.dataset_count, size=s.size, seed=s.seed, split="train")
        log(f"pretrain: base pipeline and {s.dataset_count} shapes images written; fitting the VAE")
        vae = fit_vae(base, _images(data), steps=s.vae_steps, seed=s.seed, log=log)
        log(f"pretrain: VAE reconstruction MSE {vae['mse']:.4f}; SFT for {s.sft_steps} steps")
        sft.run(_sft_config(s, base, data, out))
        exported = os.path.join(out, "safetensors", f"step_{s.sft_steps}")
        for name in os.listdir(exported):
            os.replace(os.path.join(exported, name), os.path.join(tmp, name))
        marker = {"format": FORMAT, "settings": dataclasses.asdict(s), "vae": vae,
                  "sft_final_loss": _final_loss(out)}
        if s.eval_per_prompt:
            from wfm_jax.train.pretrain_eval import score_directory
            marker["heldout"] = score_directory(tmp, "heldout", per_prompt=s.eval_per_prompt,
                                                size=s.size)
            log(f"pretrain: held-out shapes_alignment {marker['heldout']['shapes_alignment']:.3f}")
        shutil.rmtree(work)
        marker.update(complete=True, build_seconds=round(time.perf_counter() - start, 1))
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump(marker, f, indent=2)
    log(f"pretrain: built {directory} in {time.perf_counter() - start:.0f} s")
    return directory


def _final_loss(out: str) -> float | None:
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        return float(lines[-1]["train/loss"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def ensure_pretrained(directory: str, settings: PretrainSettings = PretrainSettings(),
                      log=print) -> str:
    """The cached pipeline at `directory`, built first unless a complete build with these
    settings is there."""
    if is_built(directory, settings):
        return os.path.abspath(directory)
    if os.path.exists(directory):
        log(f"pretrain: {directory} is not a complete build with these settings; rebuilding it")
    else:
        log(f"pretrain: building the pretrained tiny shapes pipeline at {directory} "
            "(about 4 minutes on 2 idle CPU cores, once)")
    return build_pretrained(directory, settings, log=log)


HELDOUT_PROMPTS = tuple(s.prompt for s in heldout_scenes())
