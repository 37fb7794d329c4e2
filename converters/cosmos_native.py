"""cosmos-rl native Cosmos-Predict2.5 DiT checkpoints (`*.pt`, `net.*`) <-> diffusers
CosmosTransformer3DModel safetensors (spec cosmos_rl_wfm.md §4).

    python -m converters to-diffusers SRC.pt DST [--config CONFIG.json] [--weights ema|net|ref]
    python -m converters to-cosmos-native SRC DST.pt [--dtype bfloat16|float32]

Native files are `torch.save` dicts: released `*_ema_bf16.pt` are flat `net.<param>` -> bf16 (the
EMA weights); cosmos-rl's own `iter_*.pt` nest `{model: {net.*, net_ema.*, net_ref.*}, ...}`.
One table of (native name, diffusers name) pairs, matched whole-key, drives both directions; no
tensor changes layout (both sides are torch modules), so a round trip is bit-exact.
The diffusers config is read off the tensor shapes; what shapes cannot tell (patch size, padding
mask channel, RoPE scale, max size) comes from `--config` or else the released Predict2.5 values.
Written native files carry the recomputable buffers (RoPE ranges, zero `accum_*` counters) a
strict `load_state_dict` into cosmos-rl's net expects.

torch is needed only here (an optional extra): imported lazily, one-line error when absent.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import uuid
import zipfile
from importlib import metadata

import ml_dtypes
import numpy as np

from converters.registry import UnsupportedModelError
from converters.safetensors_io import checkpoint_meta, open_checkpoint, save_checkpoint_streaming
from converters.table import ConversionError
from wfm_jax.io.atomic import atomic_directory

CLASS_NAME = "CosmosTransformer3DModel"
TORCH_PIN = "torch==2.13.0"
# The released Predict2.5 2B transformer config: the fallback for what shapes cannot tell.
PREDICT25_DEFAULTS = {
    "in_channels": 17, "out_channels": 16, "num_attention_heads": 16, "attention_head_dim": 128,
    "num_layers": 28, "mlp_ratio": 4.0, "text_embed_dim": 1024, "adaln_lora_dim": 256,
    "max_size": [128, 240, 240], "patch_size": [1, 2, 2], "rope_scale": [1.0, 3.0, 3.0],
    "concat_padding_mask": True, "extra_pos_embed_type": None, "use_crossattn_projection": True,
    "crossattn_proj_in_channels": 100352, "encoder_hidden_states_channels": 1024,
    "controlnet_block_every_n": None, "img_context_dim_in": None, "img_context_num_tokens": 256,
    "img_context_dim_out": 2048}
# what no tensor shape reveals: from --config, else PREDICT25_DEFAULTS
NOT_IN_SHAPES = ("patch_size", "concat_padding_mask", "max_size", "rope_scale")
# Non-parameter entries of a native net (spec §4): dropped on the way in, re-added on the way out.
ROPE_BUFFERS = ("pos_embedder.seq", "pos_embedder.dim_spatial_range",
                "pos_embedder.dim_temporal_range")
COUNTERS = {"accum_video_sample_counter": "int64", "accum_image_sample_counter": "int64",
            "accum_iteration": "int64", "accum_train_in_hours": "float32"}
WEIGHT_PREFIXES = {"ema": ("net_ema.", "net."), "net": ("net.",), "ref": ("net_ref.",)}
CONTAINER_KEYS = ("model", "state_dict", "module", "ema")  # dict entries that wrap the weights
DTYPES = ("bfloat16", "float32")


class MissingTorchError(RuntimeError):
    """torch is not installed (the message says which version to install)."""


def _torch():
    try:
        import torch
    except ImportError:
        raise MissingTorchError(f"cosmos-rl native .pt checkpoints need torch: pip install "
                                f"{TORCH_PIN}") from None
    return torch


# ---- the mapping table ------------------------------------------------------------------------

_TOP = (("x_embedder.proj.1.weight", "patch_embed.proj.weight"),
        ("t_embedder.1.linear_1.weight", "time_embed.t_embedder.linear_1.weight"),
        ("t_embedder.1.linear_2.weight", "time_embed.t_embedder.linear_2.weight"),
        ("t_embedding_norm.weight", "time_embed.norm.weight"))
_FINAL = (("final_layer.adaln_modulation.1.weight", "norm_out.linear_1.weight"),
          ("final_layer.adaln_modulation.2.weight", "norm_out.linear_2.weight"),
          ("final_layer.linear.weight", "proj_out.weight"))
_PROJ = (("crossattn_proj.0.weight", "crossattn_proj.0.weight"),
         ("crossattn_proj.0.bias", "crossattn_proj.0.bias"))
_ATTN = (("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"), ("output_proj", "to_out.0"),
         ("q_norm", "norm_q"), ("k_norm", "norm_k"))


def _block(i: int) -> list[tuple[str, str]]:
    n, d = f"blocks.{i}", f"transformer_blocks.{i}"
    pairs = []
    for native, norm in (("self_attn", "norm1"), ("cross_attn", "norm2"), ("mlp", "norm3")):
        for j in (1, 2):
            pairs.append((f"{n}.adaln_modulation_{native}.{j}.weight", f"{d}.{norm}.linear_{j}.weight"))
    for native, attn in (("self_attn", "attn1"), ("cross_attn", "attn2")):
        pairs += [(f"{n}.{native}.{a}.weight", f"{d}.{attn}.{b}.weight") for a, b in _ATTN]
    pairs += [(f"{n}.mlp.layer1.weight", f"{d}.ff.net.0.proj.weight"),
              (f"{n}.mlp.layer2.weight", f"{d}.ff.net.2.weight")]
    return pairs


def build_table(config: dict) -> list[tuple[str, str]]:
    """(native key without `net.`, diffusers key) for every parameter of `config`'s model."""
    pairs = list(_TOP)
    for i in range(config["num_layers"]):
        pairs += _block(i)
    pairs += list(_FINAL)
    if config["use_crossattn_projection"]:
        pairs += list(_PROJ)
    return pairs


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """diffusers key -> shape (torch Linear layout (out, in)) for `config`."""
    hd = config["attention_head_dim"]
    d = config["num_attention_heads"] * hd
    lora, text = config["adaln_lora_dim"], config["text_embed_dim"]
    patch = math.prod(config["patch_size"])
    cin = config["in_channels"] + (1 if config["concat_padding_mask"] else 0)
    ff = int(d * config["mlp_ratio"])
    shapes = {"patch_embed.proj.weight": (d, cin * patch),
              "time_embed.t_embedder.linear_1.weight": (d, d),
              "time_embed.t_embedder.linear_2.weight": (3 * d, d), "time_embed.norm.weight": (d,),
              "norm_out.linear_1.weight": (lora, d), "norm_out.linear_2.weight": (2 * d, lora),
              "proj_out.weight": (patch * config["out_channels"], d)}
    for i in range(config["num_layers"]):
        p = f"transformer_blocks.{i}"
        for n in ("norm1", "norm2", "norm3"):
            shapes[f"{p}.{n}.linear_1.weight"] = (lora, d)
            shapes[f"{p}.{n}.linear_2.weight"] = (3 * d, lora)
        for attn, kv in (("attn1", d), ("attn2", text)):
            shapes.update({f"{p}.{attn}.to_q.weight": (d, d), f"{p}.{attn}.to_k.weight": (d, kv),
                           f"{p}.{attn}.to_v.weight": (d, kv), f"{p}.{attn}.to_out.0.weight": (d, d),
                           f"{p}.{attn}.norm_q.weight": (hd,), f"{p}.{attn}.norm_k.weight": (hd,)})
        shapes[f"{p}.ff.net.0.proj.weight"] = (ff, d)
        shapes[f"{p}.ff.net.2.weight"] = (d, ff)
    if config["use_crossattn_projection"]:
        out, inp = config["encoder_hidden_states_channels"], config["crossattn_proj_in_channels"]
        shapes["crossattn_proj.0.weight"] = (out, inp)
        shapes["crossattn_proj.0.bias"] = (out,)
    return shapes


def _rope_dims(head_dim: int) -> tuple[int, int]:
    dim_h = head_dim // 6 * 2  # height and width share this split; time takes the rest
    return dim_h, head_dim - 2 * dim_h


def native_buffers(config: dict) -> dict[str, np.ndarray]:
    """The recomputable non-parameter entries of a native net (spec §4), as numpy."""
    dim_h, dim_t = _rope_dims(config["attention_head_dim"])
    grid = [m // p for m, p in zip(config["max_size"], config["patch_size"], strict=True)]
    out = {"pos_embedder.seq": np.arange(max(grid), dtype=np.float32),
           "pos_embedder.dim_spatial_range":
               np.arange(0, dim_h, 2, dtype=np.float32)[: dim_h // 2] / np.float32(dim_h),
           "pos_embedder.dim_temporal_range":
               np.arange(0, dim_t, 2, dtype=np.float32)[: dim_t // 2] / np.float32(dim_t)}
    out.update({k: np.zeros((), dtype) for k, dtype in COUNTERS.items()})
    return out


# ---- config from shapes -------------------------------------------------------------------------

_BLOCK_RE = re.compile(r"blocks\.(\d+)\.")


def _need(shapes: dict, key: str) -> tuple[int, ...]:
    if key not in shapes:
        raise ConversionError(f"native checkpoint lacks net.{key}: not a Cosmos-Predict2.5 DiT")
    return shapes[key]


def _check_supported(cfg: dict) -> None:
    if cfg["extra_pos_embed_type"] is not None or cfg["img_context_dim_in"] \
            or cfg["controlnet_block_every_n"]:
        raise UnsupportedModelError("only the Cosmos-Predict2.5 DiT (no learnable position "
                                    "embedding, image context or ControlNet) is supported")


def infer_config(shapes: dict[str, tuple[int, ...]], config: dict | None = None) -> dict:
    """Complete diffusers transformer config for native `shapes` (keys without `net.`).

    Shapes fix the sizes; `config` (a diffusers config dict, optional) supplies what they cannot
    tell and must agree with what they do tell.
    """
    given = {k: v for k, v in (config or {}).items() if not k.startswith("_")}
    if config and config.get("_class_name", CLASS_NAME) != CLASS_NAME:
        raise UnsupportedModelError(f"--config names {config['_class_name']!r}, not {CLASS_NAME}")
    cfg = {**PREDICT25_DEFAULTS, **given}
    d, cin = _need(shapes, "x_embedder.proj.1.weight")
    head_dim = _need(shapes, "blocks.0.self_attn.q_norm.weight")[0]
    layers = sorted({int(m.group(1)) for k in shapes if (m := _BLOCK_RE.match(k))})
    if layers != list(range(len(layers))):
        raise ConversionError(f"native blocks are not numbered 0..n-1: {layers[:8]}")
    patch = math.prod(cfg["patch_size"])
    pad = 1 if cfg["concat_padding_mask"] else 0
    out = _need(shapes, "final_layer.linear.weight")[0]
    if d % head_dim or cin % patch or out % patch:
        raise ConversionError(
            f"shapes do not fit patch_size {list(cfg['patch_size'])}: patch embedding [{d}, {cin}], "
            f"output projection [{out}, {d}], head dim {head_dim}; pass --config CONFIG.json")
    found = {
        "num_layers": len(layers), "attention_head_dim": head_dim,
        "num_attention_heads": d // head_dim, "in_channels": cin // patch - pad,
        "out_channels": out // patch,
        "adaln_lora_dim": _need(shapes, "blocks.0.adaln_modulation_self_attn.1.weight")[0],
        "mlp_ratio": _need(shapes, "blocks.0.mlp.layer1.weight")[0] / d,
        "text_embed_dim": _need(shapes, "blocks.0.cross_attn.k_proj.weight")[1],
        "use_crossattn_projection": "crossattn_proj.0.weight" in shapes}
    if found["use_crossattn_projection"]:
        found["encoder_hidden_states_channels"], found["crossattn_proj_in_channels"] = \
            shapes["crossattn_proj.0.weight"]
    wrong = [f"{k}={given[k]!r} (checkpoint: {v!r})" for k, v in found.items()
             if k in given and given[k] != v]
    if wrong:
        raise ConversionError(f"--config disagrees with the checkpoint's shapes: {', '.join(wrong)}")
    cfg.update(found)
    _check_supported(cfg)
    if "pos_embedder.seq" in shapes:
        grid = max(m // p for m, p in zip(cfg["max_size"], cfg["patch_size"], strict=True))
        if shapes["pos_embedder.seq"] != (grid,):
            source = "--config" if "max_size" in given else "the default"
            raise ConversionError(
                f"net.pos_embedder.seq has {math.prod(shapes['pos_embedder.seq'])} entries but {source} "
                f"max_size {list(cfg['max_size'])} / patch_size {list(cfg['patch_size'])} gives "
                f"{grid}; pass --config CONFIG.json with the model's max_size")
    return cfg


def diffusers_config(cfg: dict) -> dict:
    try:
        version = metadata.version("diffusers")
    except metadata.PackageNotFoundError:  # diffusers need not be installed to write its config
        version = "0.42.1"
    return {"_class_name": CLASS_NAME, "_diffusers_version": version, **cfg}


# ---- reading native files -----------------------------------------------------------------------

def is_dcp_dir(path: str) -> bool:
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, ".metadata"))
        or any(n.endswith(".distcp") for n in os.listdir(path))
        or os.path.isfile(os.path.join(path, "model", ".metadata")))


def refuse_dcp(path: str) -> None:
    if is_dcp_dir(path):
        model = os.path.join(path, "model")
        src = model if os.path.isdir(model) else path
        raise ConversionError(
            f"{path} is a torch distributed checkpoint (DCP) directory; consolidate it first: "
            f"python -m torch.distributed.checkpoint.format_utils dcp_to_torch {src} OUT.pt "
            f"(torch.distributed.checkpoint.format_utils.dcp_to_torch_save), then convert OUT.pt")


def _load_pt(path: str):
    torch = _torch()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such native checkpoint file: {path}")
    try:  # weights_only: a checkpoint is data, never code; mmap (zip format only) keeps it lazy
        return torch.load(path, map_location="cpu", weights_only=True,
                          mmap=zipfile.is_zipfile(path))
    except Exception as e:  # not a torch file, or a pickle of more than tensors and containers
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConversionError(f"{path}: not a checkpoint torch.load(weights_only=True) accepts "
                              f"({why})") from e


def native_params(path: str, weights: str = "ema") -> dict:
    """Native key (without prefix) -> torch tensor: parameters and buffers of one net in `path`.

    weights: which net of a training checkpoint ("ema": net_ema.*, else the flat net.* that
    released files hold; "net": net.*; "ref": net_ref.*).
    """
    refuse_dcp(path)
    if weights not in WEIGHT_PREFIXES:
        raise ValueError(f"weights must be one of {sorted(WEIGHT_PREFIXES)}, not {weights!r}")
    state = _load_pt(path)
    while isinstance(state, dict) and not any(isinstance(k, str) and k.startswith("net")
                                              for k in state):
        inner = next((state[k] for k in CONTAINER_KEYS if isinstance(state.get(k), dict)), None)
        if inner is None:
            break
        state = inner
    if not isinstance(state, dict):
        raise ConversionError(f"{path} holds a {type(state).__name__}, not a state dict")
    for prefix in WEIGHT_PREFIXES[weights]:
        picked = {k[len(prefix):]: v for k, v in state.items()
                  if isinstance(k, str) and k.startswith(prefix)}
        # TransformerEngine's per-module state (spec §4): not a weight, may not be a tensor
        picked = {k: v for k, v in picked.items() if not k.endswith("_extra_state")}
        odd = sorted(k for k, v in picked.items() if not isinstance(v, _torch().Tensor))
        if odd:
            raise ConversionError(f"{path}: {prefix}{odd[0]} is a {type(picked[odd[0]]).__name__}, "
                                  f"not a tensor")
        if picked:
            return picked
    sample = ", ".join(sorted(map(str, state))[:5])
    raise ConversionError(f"{path} has no {' or '.join(WEIGHT_PREFIXES[weights])}* keys "
                          f"(it starts: {sample})")


def _to_numpy(t) -> np.ndarray:
    torch = _torch()
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: reinterpret the bits (exact)
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: np.ndarray):
    torch = _torch()
    a = np.array(a, order="C")  # a writable copy; keeps 0-d counters 0-d
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _check_shapes(config: dict, got: dict[str, tuple], where: str) -> None:
    want = expected_shapes(config)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = [f"{k} {tuple(got[k])} (expected {want[k]})" for k in sorted(want)
             if k in got and tuple(got[k]) != want[k]]
    for label, items in (("missing", missing), ("unexpected", extra), ("wrong shape", wrong)):
        if items:
            more = f" (+{len(items) - 4} more)" if len(items) > 4 else ""
            raise ConversionError(f"{where}: {label}: {', '.join(items[:4])}{more}")


# ---- native -> diffusers ------------------------------------------------------------------------

def _read_config(config) -> dict | None:
    if config is None or isinstance(config, dict):
        return config
    try:
        with open(config) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"--config {config} is not JSON: {e}") from None


def native_to_diffusers_dir(src_pt: str, dst_dir: str, config=None, *, weights: str = "ema",
                            dtype: str | None = None, max_shard_bytes: int = 2 << 30) -> dict:
    """Write the diffusers transformer dir `dst_dir` (config.json + safetensors) for the native
    checkpoint `src_pt`; returns its config. config: a diffusers config dict or JSON path for what
    shapes cannot tell. dtype: cast to "float32"/"bfloat16"/"float16" (default: keep stored).
    The loader may call this to use a native `.pt` as a model path."""
    params = native_params(src_pt, weights)
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    cfg = infer_config(shapes, _read_config(config))
    known = {n for n, _ in build_table(cfg)} | set(ROPE_BUFFERS) | set(COUNTERS)
    unknown = sorted(k for k in params if k not in known)
    if unknown:  # cosmos-rl logs and drops these; silently losing weights is worse (spec §10)
        more = f" (+{len(unknown) - 4} more)" if len(unknown) > 4 else ""
        raise ConversionError(f"{src_pt}: native keys with no diffusers counterpart: "
                              f"net.{', net.'.join(unknown[:4])}{more}")
    table = {d: n for n, d in build_table(cfg)}
    _check_shapes(cfg, {d: shapes[n] for d, n in table.items() if n in shapes}, src_pt)
    floating = [n for n in table.values() if not params[n].is_floating_point()]
    if floating:
        raise ConversionError(f"{src_pt}: non-float parameters: {', '.join(floating[:4])}")
    for name, dim in zip(ROPE_BUFFERS[1:], _rope_dims(cfg["attention_head_dim"]), strict=True):
        if shapes.get(name, (dim // 2,)) != (dim // 2,):
            raise ConversionError(f"{src_pt}: net.{name} {shapes[name]} does not fit head dim "
                                  f"{cfg['attention_head_dim']}")
    cast = None if dtype is None else np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    nbytes = {d: math.prod(shapes[n]) * (cast.itemsize if cast is not None
                                         else params[n].element_size())
              for d, n in table.items()}

    def load_many(keys):
        out = {k: _to_numpy(params[table[k]]) for k in keys}
        return out if cast is None else {k: v.astype(cast) for k, v in out.items()}

    full = diffusers_config(cfg)
    with atomic_directory(dst_dir) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(full, f, indent=2)
        save_checkpoint_streaming(nbytes, load_many, tmp, max_shard_bytes=max_shard_bytes)
    return full


# ---- diffusers -> native ------------------------------------------------------------------------

@contextlib.contextmanager
def _atomic_file(dst: str):
    """Yield a temporary sibling path to write; on success one `os.replace` puts it at `dst`, on
    error it is removed, so `dst` is never seen half-written."""
    dst = os.path.abspath(dst)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def _transformer_dir(src: str) -> str:
    for d in (src, os.path.join(src, "transformer")):
        if os.path.isfile(os.path.join(d, "config.json")):
            return d
    raise FileNotFoundError(f"no config.json in {src} (or {src}/transformer): expected a diffusers "
                            f"{CLASS_NAME} folder")


def diffusers_to_native(src: str, dst_pt: str, dtype: str = "bfloat16") -> None:
    """Write the native flat `net.*` checkpoint `dst_pt` for the diffusers transformer dir `src`
    (or a pipeline dir with transformer/): parameters cast to `dtype` (bf16 as released), then
    the RoPE buffers and zero counters so cosmos-rl's strict loader accepts it."""
    torch = _torch()
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, not {dtype!r}")
    directory = _transformer_dir(src)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    if config.get("_class_name") != CLASS_NAME:
        raise UnsupportedModelError(f"{directory}/config.json is a {config.get('_class_name')!r}, "
                                    f"not a {CLASS_NAME}")
    cfg = {**PREDICT25_DEFAULTS, **{k: v for k, v in config.items() if not k.startswith("_")}}
    _check_supported(cfg)
    meta = checkpoint_meta(directory)
    _check_shapes(cfg, {k: v[0] for k, v in meta.items()}, directory)
    loaders = open_checkpoint(directory)
    target = getattr(torch, dtype)
    out = {f"net.{n}": _to_torch(loaders[d]()).to(target) for n, d in build_table(cfg)}
    out.update({f"net.{k}": _to_torch(v) for k, v in native_buffers(cfg).items()})
    with _atomic_file(dst_pt) as tmp:
        torch.save(out, tmp)
