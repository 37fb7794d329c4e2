"""Per-device memory of an SD3.5-Medium full fine-tune, from XLA's memory analysis.

    python -m wfm_jax.plan --config configs/sd35_sft.py [--devices 8] [--batch-per-device 4]
        [--size 1024] [--remat dots] [--no-scan] [--frozen-dtype float32]
        [--set policy.parallelism.fsdp=1 ...]

Compiles the recipe's own SFT train step (the trainer's jit: mesh, rules, shardings, optimizer,
EMA) on N virtual CPU devices with abstract SD3.5-Medium-shaped weights: nothing is allocated
and no model is read. Prints the per-device bytes of the train state (params, Adam moments,
EMA), of the frozen text encoders and VAE (in --frozen-dtype, default the compute dtype, under
the mesh's parameter shardings) and XLA's temporaries of the step. CPU keeps bf16 work in fp32,
so the temp figure is above a GPU's (about 30%). --no-scan and --frozen-dtype float32 with
`--set policy.parallelism.data=-1 --set policy.parallelism.fsdp=1` give the layout before
issue 21.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

GiB = 2 ** 30

# stabilityai/stable-diffusion-3.5-medium text encoders (config.json fields that size them)
CLIP_L = dict(hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
              num_attention_heads=12)
CLIP_G = dict(hidden_size=1280, intermediate_size=5120, projection_dim=1280,
              num_hidden_layers=32, num_attention_heads=20, hidden_act="gelu")
T5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m wfm_jax.plan", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/sd35_sft.py")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--batch-per-device", type=int, default=4)
    p.add_argument("--size", type=int, default=1024, help="image side in pixels")
    p.add_argument("--remat", default=None, help="none | full | dots (default: the recipe's)")
    p.add_argument("--no-scan", action="store_true", help="unroll the blocks (no lax.scan)")
    p.add_argument("--frozen-dtype", default=None,
                   help="text encoders / VAE weights (default: train.compute_dtype)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override, e.g. policy.parallelism.fsdp=1")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


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


def plan(args) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from wfm_jax import mesh as wmesh
    from wfm_jax.bench.suites import SD35_MEDIUM
    from wfm_jax.config import load_config
    from wfm_jax.models.sd3.transformer import SD3Transformer
    from wfm_jax.train import setup as setup_lib, sft
    from wfm_jax.train.state import TrainState

    overrides = [tuple(kv.split("=", 1)) for kv in args.set]
    config = load_config(args.config, overrides)
    t, d = config.train, config.policy.diffusers
    remat = args.remat or config.policy.remat
    mesh = wmesh.make_mesh(config.policy.parallelism)
    rules = wmesh.active_rules()
    compute = setup_lib.DTYPES[t.compute_dtype]
    model = nnx.eval_shape(lambda: SD3Transformer(
        SD35_MEDIUM, dtype=compute, param_dtype=setup_lib.DTYPES[t.param_dtype],
        rngs=nnx.Rngs(0), remat=remat, scan_layers=not args.no_scan))
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
    setup = _Setup(config, mesh, tuple(rules), graphdef, frozen, tx, state_sh)
    step = sft._build_train_step(setup, 3.0, d.weighting_scheme, float(d.logit_mean),
                                 float(d.logit_std), float(d.mode_scale))
    batch = args.batch_per_device * mesh.devices.size // mesh.shape["context"]
    latent, text = args.size // 8, 77 + int(d.max_prompt_length)
    rows = setup.batch_sharding()
    arg = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
    compiled = step.lower(state, frozen, arg((batch, 16, latent, latent)),
                          arg((batch, text, SD35_MEDIUM["joint_attention_dim"])),
                          arg((batch, SD35_MEDIUM["pooled_projection_dim"])),
                          arg((batch,), jnp.int32)).compile()
    m = compiled.memory_analysis()
    frozen_dtype = setup_lib.DTYPES[args.frozen_dtype or t.compute_dtype]
    out = {
        "config": args.config, "devices": int(mesh.devices.size),
        "mesh": {k: int(v) for k, v in mesh.shape.items()}, "global_batch": batch,
        "batch_per_device": args.batch_per_device, "size": args.size, "remat": remat,
        "scan_layers": not args.no_scan, "frozen_dtype": jnp.dtype(frozen_dtype).name,
        "train_state_bytes": _per_device_bytes(state),
        "transformer_frozen_bytes": _per_device_bytes(frozen),
        "encoders_vae_bytes": frozen_bytes(mesh, rules, frozen_dtype),
        "step_temp_bytes": int(m.temp_size_in_bytes),
        "step_output_bytes": int(m.output_size_in_bytes),
        "step_alias_bytes": int(m.alias_size_in_bytes),
    }
    # donated state: the step's outputs reuse its arguments (alias), temp comes on top
    out["total_bytes"] = (out["train_state_bytes"] + out["transformer_frozen_bytes"]
                          + out["encoders_vae_bytes"] + out["step_temp_bytes"]
                          + out["step_output_bytes"] - out["step_alias_bytes"])
    return out


def describe(r: dict) -> str:
    g = lambda k: f"{r[k] / GiB:.1f} GiB"
    mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
    return "\n".join([
        f"{r['config']}: {r['devices']} devices ({mesh}), batch {r['batch_per_device']}/device "
        f"({r['global_batch']} global), {r['size']}x{r['size']}, remat {r['remat']}, "
        f"scan {'on' if r['scan_layers'] else 'off'}, encoders/VAE in {r['frozen_dtype']}",
        f"  per device: train state {g('train_state_bytes')}, frozen transformer buffers "
        f"{g('transformer_frozen_bytes')}, text encoders + VAE {g('encoders_vae_bytes')}, "
        f"step temp {g('step_temp_bytes')}, step outputs not aliased "
        f"{(r['step_output_bytes'] - r['step_alias_bytes']) / GiB:.1f} GiB",
        f"  total {g('total_bytes')} per device ({r['total_bytes'] / 1e9:.1f} GB; "
        f"{'fits' if r['total_bytes'] <= 80e9 else 'does not fit'} 80 GB; CPU analysis: GPU "
        f"temp is lower)"])


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _virtual_devices(args.devices)
    r = plan(args)
    print(json.dumps(r) if args.json else describe(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
