"""Cache the text embeddings of prompts, so training need not run the text encoder (for Cosmos
the 7B Reason1 tower).

    python -m wfm_jax.embed --model DIR --prompts FILE_OR_DATASET --out DIR
        [--max-sequence-length N] [--batch-size B] [--dtype float32|float16]

--prompts is a text file (one prompt a line: names 000000, 000001, ...) or a WFM dataset dir (its
metas/<name>.txt). Each prompt's embedding, exactly what the family's `encode_prompt` gives for
it (batch axis dropped), goes to OUT/text_embedding/<name>.npy (one array) or .safetensors (a
family whose conditioning has several arrays), the WFM layout's files: the family's
`cond_from_embedding` reads them back. Each file is written under a temporary name and renamed.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from wfm_jax.core import xla_flags

DTYPES = ("float32", "float16")


def read_named_prompts(path: str) -> list[tuple[str, str]]:
    """(name, prompt) from a prompts file or a WFM dataset dir (metas/*.txt)."""
    metas = os.path.join(path, "metas")
    if os.path.isdir(path):
        if not os.path.isdir(metas):
            raise ValueError(f"{path} is a directory without metas/ (not a WFM dataset)")
        out = []
        for file in sorted(os.listdir(metas)):
            if file.endswith(".txt"):
                with open(os.path.join(metas, file), encoding="utf-8") as f:
                    out.append((file[:-4], f.read().strip()))
    else:
        try:
            with open(path, encoding="utf-8") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ValueError(f"cannot read prompts file {path}: {e.strerror}")
        out = [(f"{i:06d}", p) for i, p in enumerate(lines)]
    if not out:
        raise ValueError(f"no prompts in {path}")
    return out


def _save(path_stem: str, arrays: dict[str, np.ndarray]) -> str:
    """One array -> .npy, several -> .safetensors; atomically."""
    if len(arrays) == 1:
        path = path_stem + ".npy"
        tmp = path_stem + ".tmp.npy"
        np.save(tmp, next(iter(arrays.values())))
    else:
        from safetensors.numpy import save_file
        path = path_stem + ".safetensors"
        tmp = path_stem + ".tmp.safetensors"
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, tmp)
    os.replace(tmp, path)
    return path


def embed_prompts(pipe, named: list[tuple[str, str]], out_dir: str, *,
                  max_sequence_length: int, batch_size: int = 8,
                  dtype: str = "float32") -> list[str]:
    """Write OUT/text_embedding/<name>.npy|.safetensors per prompt; returns the paths. Batches
    are padded to batch_size with the last prompt, so one compiled encoder serves them all."""
    import jax
    import jax.numpy as jnp

    from wfm_jax.programs.encode import TextEncoder

    emb_dir = os.path.join(out_dir, "text_embedding")
    os.makedirs(emb_dir, exist_ok=True)
    encoder = TextEncoder(pipe, max_sequence_length)
    written = []
    for start in range(0, len(named), batch_size):
        chunk = named[start:start + batch_size]
        prompts = [p for _, p in chunk]
        prompts += [prompts[-1]] * (batch_size - len(prompts))
        ids = {k: jnp.asarray(v) for k, v in encoder.tokenize(prompts).items()}
        cond = jax.device_get(encoder(ids))
        for row, (name, _) in enumerate(chunk):
            arrays = {k: np.asarray(v[row]).astype(dtype) for k, v in cond.items()}
            written.append(_save(os.path.join(emb_dir, name), arrays))
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m wfm_jax.cli.embed", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local diffusers pipeline dir")
    p.add_argument("--prompts", required=True, help="prompts file or WFM dataset dir (metas/)")
    p.add_argument("--out", required=True, help="dir that gets text_embedding/<name>.npy")
    p.add_argument("--max-sequence-length", type=int, help="default: the family's")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    args = p.parse_args(argv)
    xla_flags.apply()
    try:
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        named = read_named_prompts(args.prompts)
        from wfm_jax.families.base import load_pipeline
        pipe = load_pipeline(args.model)
        written = embed_prompts(pipe, named, args.out,
                                max_sequence_length=(args.max_sequence_length
                                                     or pipe.default_max_sequence_length),
                                batch_size=min(args.batch_size, len(named)), dtype=args.dtype)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} embedding(s) to {os.path.join(args.out, 'text_embedding')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
