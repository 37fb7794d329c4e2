"""Per-device memory, FLOPs and collective bytes of a recipe's train step, from XLA's own analysis
of the compiled step on N simulated devices, before a single weight is loaded.

    python -m wfm_jax.plan --config X.py [--config.a.b=v ...] [--devices N]
        [--device-kind h100|h200|v5p|v6e] [--batch-per-device 4] [--size 1024] [--frames 81]
        [--remat dots] [--no-scan] [--frozen-dtype float32] [--json]

Compiles the recipe's own SFT train step (the trainer's jit: mesh, rules, shardings, optimizer,
EMA) with abstract weights of the recipe's transformer: its `transformer/config.json` when the
model dir is on disk (the config only, no weights), else the family's released shape
(SD3.5-Medium, Wan2.1-T2V-1.3B). Families planned: SD3 and Wan (SFT). Prints the per-device
bytes of the params, optimizer state, EMA, frozen transformer buffers, the SD3 text encoders +
VAE (in --frozen-dtype, default the compute dtype), XLA's temporaries of the step and the peak;
FLOPs per step (XLA's cost analysis, per device); the bytes its collectives move; and whether
the peak fits the device kind's memory. CPU keeps bf16 work in fp32, so the temp figure is above
a GPU's (about 30%). `--no-scan`, `--frozen-dtype float32` with
`--config.policy.parallelism.data=-1 --config.policy.parallelism.fsdp=1` give the layout before
issue 21.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

GiB = 2 ** 30

# stabilityai/stable-diffusion-3.5-medium text encoders (config.json fields that size them)
CLIP_L = dict(hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
              num_attention_heads=12)
CLIP_G = dict(hidden_size=1280, intermediate_size=5120, projection_dim=1280,
              num_hidden_layers=32, num_attention_heads=20, hidden_act="gelu")
T5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu")


# usable memory per device (bytes): H100 SXM 80 GB, H200 141 GB, TPU v5p 95 GiB, v6e 32 GiB
DEVICE_MEMORY = {"h100": 80e9, "h200": 141e9, "v5p": 95 * GiB, "v6e": 32 * GiB}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.plan", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/sd35_sft.py")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--device-kind", choices=sorted(DEVICE_MEMORY), default="h100")
    p.add_argument("--batch-per-device", type=int, default=4)
    p.add_argument("--size", type=int, default=None,
                   help="image side in pixels (default: the recipe's inference_size)")
    p.add_argument("--frames", type=int, default=None,
                   help="video families: frames (default: the recipe's train_frames, 4k+1)")
    p.add_argument("--remat", default=None, help="a policy.remat name (default: the recipe's)")
    p.add_argument("--no-scan", action="store_true", help="unroll the blocks (no lax.scan)")
    p.add_argument("--frozen-dtype", default=None,
                   help="text encoders / VAE weights (default: train.compute_dtype)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, e.g. policy.parallelism.fsdp=1")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args, rest = p.parse_known_args(argv)
    for item in rest:  # --config.a.b=v, as wfm_jax.main takes them
        if not item.startswith("--config.") or "=" not in item:
            p.error(f"unrecognized argument {item!r}")
        args.set.append(item[len("--config."):])
    return args


def _virtual_devices(n: int) -> None:
    """N CPU devices; must run before jax starts its backend."""
    flag = f"--xla_force_host_platform_device_count={n}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
    import jax
    jax.config.update("jax_platforms", "cpu")


@dataclasses.dataclass
class _Setup:
    """The parts of train.setup.TrainSetup the SFT step is built from, abstract."""
    config: object
    mesh: object
    rules: tuple
    graphdef: object
    frozen: object
    tx: object
    shardings: object
    pipe: object

    def batch_sharding(self):
        from wfm_jax.train.setup import batch_sharding
        return batch_sharding(self.mesh, self.rules)


def _abstract(tree, shardings):
    import jax
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def _placed(state, shardings):
    """An abstract nnx.State whose values carry their shardings (dotted path -> sharding)."""
    import jax
    from flax import nnx
    out = []
    for path, var in state.flat_state():
        value = var.get_value()
        sharding = shardings[".".join(map(str, path))]
        out.append((path, var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype,
                                                           sharding=sharding))))
    return nnx.State.from_flat_path(out)


def _per_device_bytes(tree) -> int:
    import jax
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


def frozen_bytes(mesh, rules, dtype) -> int:
    """Per-device bytes of CLIP-L, CLIP-G, T5-XXL and the VAE in `dtype` on `mesh`."""
    from flax import nnx

    from wfm_jax.bench.suites import SD3_VAE
    from wfm_jax.mesh import param_shardings
    from wfm_jax.models.text.clip import make_model as clip
    from wfm_jax.models.text.t5 import make_model as t5
    from wfm_jax.models.vae.autoencoder_kl import AutoencoderKL
    total = 0
    for make in (lambda: clip(CLIP_L, param_dtype=dtype, rngs=nnx.Rngs(0)),
                 lambda: clip(CLIP_G, param_dtype=dtype, rngs=nnx.Rngs(0)),
                 lambda: t5(T5_XXL, param_dtype=dtype, rngs=nnx.Rngs(0)),
                 lambda: AutoencoderKL(SD3_VAE, param_dtype=dtype, rngs=nnx.Rngs(0))):
        model = nnx.eval_shape(make)
        shardings = param_shardings(model, mesh, rules, filter=nnx.Variable)
        state = {k: v for k, v in ((".".join(map(str, p)), v.get_value())
                                   for p, v in nnx.state(model).flat_state())}
        total += _per_device_bytes(_abstract(state, shardings))
    return total


def _transformer(config, family: str, remat: str, scan: bool, dtype, param_dtype):
    """(abstract transformer, its config) of the recipe: config.json in the model dir if there."""
    from flax import nnx
    path = os.path.join(str(config.policy.model_name_or_path), "transformer", "config.json")
    on_disk = json.load(open(path)) if os.path.isfile(path) else None
    if family == "sd3":
        from wfm_jax.bench.suites import SD35_MEDIUM
        from wfm_jax.models.sd3.transformer import SD3Transformer as cls, sd3_config as full
        cfg = full(on_disk or SD35_MEDIUM)
    elif family == "wan":
        from wfm_jax.models.wan.transformer import WAN21_T2V_1_3B, WanTransformer as cls
        from wfm_jax.models.wan.transformer import wan_config as full
        cfg = full(on_disk or WAN21_T2V_1_3B)
    else:
        raise SystemExit(f"wfm_jax.plan: policy.family={family!r} is not planned yet (sd3, wan)")
    model = nnx.eval_shape(lambda: cls(cfg, dtype=dtype, param_dtype=param_dtype,
                                       rngs=nnx.Rngs(0), remat=remat, scan_layers=scan))
    return model, cfg


def _family_shell(family: str, cfg: dict):
    """A weightless pipeline object whose velocity_with the SFT step calls."""
    from wfm_jax.models.family import family_named
    pipe = object.__new__(family_named(family))
    pipe.transformer, pipe.vae, pipe.text_encoders = None, None, ()
    pipe.transformer_config, pipe.vae_config, pipe.scheduler_config = cfg, {}, {}
    return pipe


def _inputs(family: str, cfg: dict, batch: int, size: int, frames: int, text_len: int):
    """Abstract (x0 latents, cond) of one global batch (VAE factor 8; Wan: 4x in time)."""
    import jax.numpy as jnp
    lat = size // 8
    if family == "sd3":
        return ((batch, cfg["in_channels"], lat, lat),
                {"prompt_embeds": (batch, text_len, cfg["joint_attention_dim"]),
                 "pooled_projections": (batch, cfg["pooled_projection_dim"])}, jnp.float32)
    return ((batch, cfg["in_channels"], (frames - 1) // 4 + 1, lat, lat),
            {"encoder_hidden_states": (batch, text_len, cfg["text_dim"])}, jnp.float32)


_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of the results of each kind of collective in an optimized HLO module (per device,
    per step; ops inside a while loop body are counted once, as written)."""
    import re
    sizes = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
             "f64": 8, "s64": 8, "u64": 8}
    out = {k: 0 for k in _COLLECTIVES}
    for line in hlo_text.splitlines():
        m = re.search(r"= (.+?) (" + "|".join(_COLLECTIVES) + r")(-start)?\(", line)
        if not m:
            continue
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)):
            if dtype in sizes:
                out[m.group(2)] += sizes[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return out


def plan(args, config=None) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from wfm_jax import mesh as wmesh
    from wfm_jax.bench.flops import count_jaxpr_flops
    from wfm_jax.config import load_config
    from wfm_jax.train import setup as setup_lib, sft
    from wfm_jax.train.state import TrainState

    if config is None:
        config = load_config(args.config, [tuple(kv.split("=", 1)) for kv in args.set])
    t, d = config.train, config.policy.diffusers
    if t.train_policy.type != "sft":
        raise SystemExit(f"wfm_jax.plan: train.train_policy.type={t.train_policy.type!r}: only "
                         f"SFT steps are planned yet")
    family = str(config.policy.family)
    remat = args.remat or config.policy.remat
    scan = bool(config.policy.scan_layers) and not args.no_scan
    if len(jax.devices()) < args.devices:
        raise SystemExit(f"wfm_jax.plan: {args.devices} devices asked, the backend has "
                         f"{len(jax.devices())} (run it as a fresh process: python -m wfm_jax.plan)")
    mesh = wmesh.make_mesh(config.policy.parallelism, devices=jax.devices()[:args.devices])
    rules = wmesh.active_rules()
    compute = setup_lib.DTYPES[t.compute_dtype]
    model, cfg = _transformer(config, family, remat, scan, compute,
                              setup_lib.DTYPES[t.param_dtype])
    shardings = wmesh.param_shardings(model, mesh, rules, filter=nnx.Variable)
    graphdef, trainable, frozen = setup_lib.split_model(model, lora=False)
    trainable, frozen = (_placed(tree, shardings) for tree in (trainable, frozen))
    tx, _ = setup_lib.make_tx(config)
    ema = setup_lib.ema_active(config)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=setup_lib.replicated(mesh))
    abstract = jax.eval_shape(lambda p, r: TrainState.create(p, tx, r, ema=ema), trainable, rng)
    param_sh = jax.tree.map(lambda x: x.sharding, trainable)
    state_sh = setup_lib.state_shardings(abstract, param_sh, mesh, tx)
    state = setup_lib.with_shardings(abstract, state_sh)
    setup = _Setup(config, mesh, tuple(rules), graphdef, frozen, tx, state_sh,
                   _family_shell(family, cfg))
    step = sft._build_train_step(setup, 3.0, d.weighting_scheme, float(d.logit_mean),
                                 float(d.logit_std), float(d.mode_scale), (0, 0))
    batch = args.batch_per_device * mesh.devices.size // mesh.shape["context"]
    size = args.size or int(d.inference_size[0])
    frames = args.frames or int(d.train_frames)
    text = (77 + int(d.max_prompt_length)) if family == "sd3" else int(d.max_prompt_length)
    x_shape, cond_shapes, dtype = _inputs(family, cfg, batch, size, frames, text)
    rows = setup.batch_sharding()
    arg = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
    with jax.set_mesh(step.mesh), wmesh.use_rules(step.rules):  # what MeshJit.lower does
        traced = step.jitted.trace(state, frozen, arg(x_shape),
                                   {k: arg(v) for k, v in cond_shapes.items()},
                                   arg((batch,), jnp.int32))
        start = time.perf_counter()
        compiled = traced.lower().compile()
        compile_seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    frozen_dtype = setup_lib.DTYPES[args.frozen_dtype or t.compute_dtype]
    out = {
        "config": args.config, "family": family, "devices": int(mesh.devices.size),
        "device_kind": args.device_kind, "device_memory_bytes": int(DEVICE_MEMORY[args.device_kind]),
        "mesh": {k: int(v) for k, v in mesh.shape.items()}, "global_batch": batch,
        "batch_per_device": args.batch_per_device, "size": size,
        "frames": frames if family != "sd3" else None, "remat": remat, "scan_layers": scan,
        "frozen_dtype": jnp.dtype(frozen_dtype).name,
        "params_bytes": _per_device_bytes(state.params),
        "optimizer_bytes": _per_device_bytes(state.opt_state),
        "ema_bytes": _per_device_bytes(state.ema) if state.ema is not None else 0,
        "train_state_bytes": _per_device_bytes(state),
        "transformer_frozen_bytes": _per_device_bytes(frozen),
        # SD3.5's CLIP-L/G + T5-XXL + VAE (a transformer fed by T5-XXL: 4096-wide text); tiny
        # and other families' encoders are not counted yet
        "encoders_vae_bytes": (frozen_bytes(mesh, rules, frozen_dtype)
                               if family == "sd3" and cfg["joint_attention_dim"] == 4096 else 0),
        "compile_seconds": round(compile_seconds, 1),
        "step_argument_bytes": int(m.argument_size_in_bytes),
        "step_temp_bytes": int(m.temp_size_in_bytes),
        "step_output_bytes": int(m.output_size_in_bytes),
        "step_alias_bytes": int(m.alias_size_in_bytes),
        # matmul + conv FLOPs of the whole step (all devices; scans x their length, remat's
        # recompute included): XLA's cost analysis counts a loop body once, so it is given
        # alongside, per device, as XLA reports it
        "flops_per_step": count_jaxpr_flops(traced.jaxpr),
        "xla_flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0,
        "collective_bytes": collective_bytes(compiled.as_text()),
    }
    # donated state: the step's outputs reuse its arguments (alias), temp comes on top
    out["total_bytes"] = (out["train_state_bytes"] + out["transformer_frozen_bytes"]
                          + out["encoders_vae_bytes"] + out["step_temp_bytes"]
                          + out["step_output_bytes"] - out["step_alias_bytes"])
    out["fits"] = out["total_bytes"] <= out["device_memory_bytes"]
    return out


def describe(r: dict) -> str:
    g = lambda k: f"{r[k] / GiB:.1f} GiB"
    mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
    shape = f"{r['size']}x{r['size']}" + (f"x{r['frames']} frames" if r["frames"] else "")
    coll = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in r["collective_bytes"].items() if v)
    return "\n".join([
        f"{r['config']} ({r['family']}): {r['devices']} devices ({mesh}), batch "
        f"{r['batch_per_device']}/device ({r['global_batch']} global), {shape}, remat "
        f"{r['remat']}, scan {'on' if r['scan_layers'] else 'off'}, encoders/VAE in "
        f"{r['frozen_dtype']}",
        f"  per device: params {g('params_bytes')}, optimizer {g('optimizer_bytes')}, EMA "
        f"{g('ema_bytes')}, frozen transformer buffers {g('transformer_frozen_bytes')}, text "
        f"encoders + VAE {g('encoders_vae_bytes')}, step temp {g('step_temp_bytes')}, step "
        f"outputs not aliased {(r['step_output_bytes'] - r['step_alias_bytes']) / GiB:.1f} GiB",
        f"  FLOPs per step {r['flops_per_step'] / 1e12:.2f} TFLOP (matmuls, all devices; "
        f"XLA per device, loop bodies once: {r['xla_flops_per_device'] / 1e12:.2f}); collectives: "
        f"{coll or 'none'}",
        fit_line(r)])


def fit_line(r: dict) -> str:
    verdict = "fits" if r["fits"] else "does not fit"
    return (f"  peak {r['total_bytes'] / GiB:.1f} GiB per device ({r['total_bytes'] / 1e9:.1f} "
            f"GB): {verdict} a {r['device_kind']} ({r['device_memory_bytes'] / 1e9:.0f} GB; "
            f"CPU analysis: GPU temp is lower)")


MEMORY_ENV = "WFM_JAX_DEVICE_MEMORY_BYTES"  # per-device limit main checks against (any backend)


def check_fits(config) -> dict | None:
    """main's check before any weight is read: plan the recipe's step on this run's devices and
    raise train.setup.SetupError (one line, the numbers) when its peak exceeds a device's memory.

    Runs on accelerators (the limit: $WFM_JAX_DEVICE_MEMORY_BYTES, else the device's own
    bytes_limit) and wherever $WFM_JAX_DEVICE_MEMORY_BYTES is set (CPU included); recipes plan
    cannot build yet (RL steps, families other than SD3 and Wan) are not checked."""
    import jax

    from wfm_jax.train.setup import SetupError, ensure_tiny_assets
    limit = os.environ.get(MEMORY_ENV)
    if limit is None:
        if jax.default_backend() == "cpu":
            return None
        limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
        if not limit:
            return None
    if (config.train.train_policy.type != "sft" or str(config.policy.family) not in ("sd3", "wan")
            or config.policy.lora.enable):
        return None
    ensure_tiny_assets(config)  # a tiny recipe's model dir holds the config.json to plan from
    devices = jax.device_count()
    context = max(1, int(config.policy.parallelism.context))
    args = parse_args(["--devices", str(devices), "--batch-per-device",
                       str(max(1, int(config.train.train_batch_per_replica) * context // devices))])
    r = plan(args, config)
    r["device_kind"] = jax.devices()[0].device_kind
    r["device_memory_bytes"], r["fits"] = int(limit), r["total_bytes"] <= int(limit)
    if not r["fits"]:
        raise SetupError(
            f"this run does not fit: {r['total_bytes'] / GiB:.2f} GiB per device (train state "
            f"{r['train_state_bytes'] / GiB:.2f}, frozen "
            f"{(r['transformer_frozen_bytes'] + r['encoders_vae_bytes']) / GiB:.2f}, "
            f"step temp {r['step_temp_bytes'] / GiB:.2f}) > {int(limit) / GiB:.2f} GiB of "
            f"{r['device_kind']} memory; try policy.remat=full, more fsdp, a smaller batch "
            f"(python -m wfm_jax.plan --config ... for the figures)")
    return r


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _virtual_devices(args.devices)
    r = plan(args)
    print(json.dumps(r) if args.json else describe(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
