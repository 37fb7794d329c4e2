"""`python -m converters to-jax | to-diffusers | to-cosmos-native SRC DST`.

to-jax:           diffusers model dir or pipeline dir (its transformer/) -> wfm_jax state dir (orbax)
to-diffusers:     wfm_jax state dir -> diffusers model dir (`<Class>.from_pretrained` loads it);
                  a cosmos-rl native `.pt` file -> diffusers CosmosTransformer3DModel dir
                  (converters.cosmos_native; needs torch)
to-cosmos-native: diffusers CosmosTransformer3DModel dir -> cosmos-rl native `net.*` `.pt`

Both stream: one group of tensors in host memory at a time, stored dtype kept (bf16 stays bf16)
unless --dtype says otherwise. Everything a header can reveal (class, keys, shapes) is checked
before anything is read; DST appears complete or not at all.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from converters import jax_state, registry
from converters.safetensors_io import open_checkpoint
from converters.table import ConversionError, to_jax_tensor
from converters.tied import tied_reader

DTYPES = ("float32", "bfloat16", "float16")
# safetensors header dtype -> bytes per element (plans the write groups)
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _np_dtype(name: str | None):
    if name is None:
        return None
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def to_jax(src: str, dst: str, dtype: str | None = None, group_bytes: int = 1 << 30) -> None:
    from converters.loading import (abstract_model, all_variables, check_against_model,
                                        read_json, resolve_model_dir, stored_keys)
    directory = resolve_model_dir(src, "transformer")
    config = read_json(os.path.join(directory, "config.json"))
    spec = registry.spec_for(config)
    table = spec.build_table(config)
    stored = stored_keys(directory, spec.tied_copies)
    meta = stored.meta
    model = abstract_model(spec, config)
    check_against_model(table, meta, model)
    shapes = {k: tuple(v.shape) for k, v in all_variables(model).items()}
    cast = _np_dtype(dtype)
    nbytes = {r.jax: math.prod(meta[r.hf][0]) * (cast.itemsize if cast is not None
                                                 else _ITEMSIZE.get(meta[r.hf][1], 4))
              for r in table}
    loaders = open_checkpoint(directory)
    by_jax = {r.jax: r for r in table}

    def load_many(keys):
        out = {}
        for key in keys:
            rule = by_jax[key]
            x = to_jax_tensor(rule, tied_reader(stored, loaders, rule.hf)(), shapes[key])
            out[key] = x.astype(cast, copy=False) if cast is not None else x
        return out

    jax_state.save_state_streaming(nbytes, load_many, config, dst, group_bytes=group_bytes)


def to_diffusers(src: str, dst: str, dtype: str | None = None,
                 max_shard_bytes: int = 2 << 30) -> None:
    from converters.loading import (abstract_model, all_variables, name_list,
                                        write_diffusers_dir)
    if not os.path.isdir(src):
        raise FileNotFoundError(f"no such wfm_jax state directory: {src}")
    if not jax_state.is_state_dir(src):
        raise FileNotFoundError(f"{src} is not a wfm_jax state dir (needs config.json and "
                                f"{jax_state.PARAMS_DIR}/)")
    config = jax_state.read_config(src)
    spec = registry.spec_for(config)
    meta = jax_state.state_meta(src)
    model = all_variables(abstract_model(spec, config))
    wrong = [f"{k} {meta[k][0]} (model {tuple(model[k].shape)})" for k in meta
             if k in model and tuple(meta[k][0]) != tuple(model[k].shape)]
    if wrong:
        raise ConversionError(f"wrong shape for {len(wrong)} path(s): {name_list(wrong)}")
    write_diffusers_dir(config, meta, lambda keys: jax_state.restore_state(src, keys=keys), dst,
                        dtype=_np_dtype(dtype), max_shard_bytes=max_shard_bytes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m converters",
        description="Convert model weights between diffusers safetensors and the wfm_jax state "
                    "(orbax), tensor by tensor.")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-jax", help="diffusers model/pipeline dir -> wfm_jax state dir")
    a.add_argument("src")
    a.add_argument("dst")
    a.add_argument("--dtype", choices=DTYPES, help="cast while converting (default: keep)")
    b = sub.add_parser("to-diffusers", help="wfm_jax state dir -> diffusers model dir")
    b.add_argument("src")
    b.add_argument("dst")
    b.add_argument("--dtype", choices=DTYPES, help="cast while converting (default: keep)")
    b.add_argument("--max-shard-gb", type=float, default=2.0, help="safetensors shard size")
    b.add_argument("--config", help="native .pt only: a diffusers transformer config.json for what "
                                    "the tensor shapes cannot tell (patch size, RoPE scale, ...)")
    b.add_argument("--weights", choices=("ema", "net", "ref"),
                   help="native .pt only: which net of a training checkpoint (default: ema)")
    c = sub.add_parser("to-cosmos-native",
                       help="diffusers CosmosTransformer3DModel dir -> cosmos-rl native .pt")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="parameter dtype (default bfloat16, as cosmos-rl releases them)")
    return parser


def _run(args) -> None:
    if args.command == "to-jax":
        to_jax(args.src, args.dst, args.dtype)
    elif args.command == "to-cosmos-native":
        from converters import cosmos_native
        cosmos_native.diffusers_to_native(args.src, args.dst, args.dtype)
    elif os.path.isfile(args.src) or _is_dcp(args.src):
        from converters import cosmos_native
        cosmos_native.native_to_diffusers_dir(args.src, args.dst, args.config,
                                              weights=args.weights or "ema", dtype=args.dtype,
                                              max_shard_bytes=int(args.max_shard_gb * (1 << 30)))
        if args.config is None:
            print(f"note: {', '.join(cosmos_native.NOT_IN_SHAPES)} are not in a native checkpoint: "
                  "used the released Cosmos-Predict2.5 values (--config CONFIG.json sets them)",
                  file=sys.stderr)
    elif args.config is not None or args.weights is not None:
        raise ValueError("--config and --weights apply to a cosmos-rl native .pt source only")
    else:
        to_diffusers(args.src, args.dst, args.dtype, int(args.max_shard_gb * (1 << 30)))


def _is_dcp(path: str) -> bool:
    from converters.cosmos_native import is_dcp_dir
    return is_dcp_dir(path)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from converters.cosmos_native import MissingTorchError
    try:
        _run(args)
    except registry.UnsupportedModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConversionError, ValueError, KeyError, OSError, MissingTorchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst}")
    return 0
