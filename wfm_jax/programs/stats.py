"""Compile the trainers' own jits on abstract arguments: the SFT step (train.sft), and an RL
algorithm's rollout chunk and update (train.rl_setup._compile) with the recipe's layout."""
from __future__ import annotations

import time

from wfm_jax.plan.abstract import per_device_bytes
from wfm_jax.plan.released import cond_shapes

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of the results of each kind of collective in an optimized HLO module (per device,
    per step; ops inside a while loop body are counted once, as written)."""
    import math
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


def compile_program(fn, *args) -> dict:
    """Trace, lower and compile a MeshJit on abstract args as its first call would: XLA's
    memory and cost analysis of the program, its matmul FLOPs and collective bytes."""
    import jax

    from wfm_jax.core import mesh as wmesh
    from wfm_jax.bench.flops import count_jaxpr_flops
    with jax.set_mesh(fn.mesh), wmesh.use_rules(fn.rules):  # what MeshJit.lower does
        traced = fn.jitted.trace(*args)
        start = time.perf_counter()
        compiled = traced.lower().compile()
        seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {
        "compile_seconds": round(seconds, 1),
        "argument_bytes": int(m.argument_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "alias_bytes": int(m.alias_size_in_bytes),
        # matmul + conv FLOPs of the whole program (all devices; scans x their length, remat's
        # recompute included); XLA's cost analysis counts a loop body once, so it is given
        # alongside, per device, as XLA reports it
        "flops": count_jaxpr_flops(traced.jaxpr),
        "xla_flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0,
        "collective_bytes": collective_bytes(compiled.as_text()),
    }


def _rows(setup, shapes: dict, dtype=None):
    import jax
    import jax.numpy as jnp
    rows = setup.batch_sharding()
    return {k: jax.ShapeDtypeStruct(v, dtype or jnp.float32, sharding=rows)
            for k, v in shapes.items()}


def _text_len(config) -> int:
    return int(config.policy.diffusers.max_prompt_length)


def latent_shape(pipe, batch: int, size, frames: int) -> tuple:
    """The family's latent shape; its one-line error for sizes / frames it cannot take."""
    try:
        return tuple(pipe.latent_shape(batch, int(size[0]), int(size[1]), frames=frames))
    except ValueError as e:
        raise SystemExit(f"wfm_jax.plan: {e}") from e


def sft_program(setup, batch: int, size, frames: int) -> dict:
    """The recipe's SFT train step on one global batch of `batch` rows."""
    import jax.numpy as jnp

    from wfm_jax.train import sft
    d = setup.config.policy.diffusers
    step = sft._build_train_step(setup, setup.pipe.shift, d.weighting_scheme,
                                 float(d.logit_mean), float(d.logit_std), float(d.mode_scale),
                                 (int(d.min_num_conditional_frames),
                                  int(d.max_num_conditional_frames)))
    x = _rows(setup, {"x": latent_shape(setup.pipe, batch, size, frames)})["x"]
    cond = _rows(setup, cond_shapes(str(setup.config.policy.family),
                                    setup.pipe.transformer_config, batch, _text_len(setup.config)))
    ids = _rows(setup, {"ids": (batch,)}, jnp.int32)["ids"]
    out = compile_program(step, setup.state, setup.frozen, x, cond, ids)
    out["batch_bytes"] = per_device_bytes((x, cond, ids))
    return out


class _PlanRun:
    """What rl_setup._compile and the algorithms' prepare read of an RLRun, abstract: the
    negative-prompt embedding comes back as shapes."""

    def __init__(self, config, setup, algo, layout):
        self.config, self.setup, self.algo = config, setup, algo
        self.micro_batches, self.rollout_chunk, self.optimize_chunks = layout
        self.mu_iterations = int(config.train.train_policy.mu_iterations)
        from wfm_jax.train.rl_setup import batch_shards
        self.row_shards = batch_shards(setup)

    def encode(self, prompts, negative: bool = False) -> dict:
        return _rows(self.setup, cond_shapes(str(self.config.policy.family),
                                             self.setup.pipe.transformer_config, len(prompts),
                                             _text_len(self.config)))


def rl_aux_fn(config):
    """The algorithm's TrainState.aux (old copy, KL reference) as rl_setup.build keeps it."""
    from wfm_jax.train.rl_setup import ALGORITHMS
    algo_cls = ALGORITHMS[config.train.train_policy.type]
    moves = getattr(algo_cls, "moves_reference", None)
    keep_ref = config.train.train_policy.kl_beta > 0 and (
        not config.policy.lora.enable or (moves is not None and moves(config)))
    return lambda params: dict(algo_cls.init_aux(params), **({"ref": params} if keep_ref else {}))


def rl_programs(setup, size, frames: int) -> tuple[dict, dict, dict]:
    """(rollout chunk, update, layout) of the recipe's RL algorithm: the trainer's own jits
    (rl_setup._compile) compiled on the recipe's global batch and rollout chunk."""
    import jax
    import jax.numpy as jnp

    from wfm_jax.train import rl_setup
    from wfm_jax.train.setup import SetupError
    config = setup.config
    algo = rl_setup.ALGORITHMS[config.train.train_policy.type](config, setup.pipe.shell())
    try:
        layout = rl_setup._check_layout(config, setup)
    except SetupError as e:
        raise SystemExit(f"wfm_jax.plan: {e}") from e
    run = _PlanRun(config, setup, algo, layout)
    fns = rl_setup._compile(run)
    shared = algo.prepare(run) if hasattr(algo, "prepare") else {}
    chunk, rows = run.rollout_chunk, int(config.train.train_batch_per_replica)
    family, t_cfg, text = str(config.policy.family), setup.pipe.transformer_config, _text_len(config)
    latents = _rows(setup, {"x": latent_shape(setup.pipe, chunk, size, frames)})["x"]
    cond = _rows(setup, cond_shapes(family, t_cfg, chunk, text))
    inputs = dict(shared)
    if getattr(algo, "reads_data", False) and algo.data_beta:  # DDRL's data term: clean latents
        inputs["data_x0"] = latents
    media = getattr(algo, "media", None)  # rl_data.ItemMedia (NFT, GRPO, DDRL)
    if media is not None and media.conditions:  # video2world: the family's conditioning entries
        counts = jax.ShapeDtypeStruct((chunk,), jnp.int32, sharding=latents.sharding)
        extra = jax.eval_shape(setup.pipe.video_condition, latents, counts)
        cond = {**cond, **_rows(setup, {k: v.shape for k, v in extra.items()})}
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=setup.state.rng.sharding)
    vae_state = _vae_state(setup)
    rollout = compile_program(fns["rollout"], setup.state, setup.frozen, vae_state, latents,
                              cond, key, inputs)
    # the update takes the whole batch: every chunk's stored fields and conditioning
    fields = jax.eval_shape(lambda *a: fns["rollout"].jitted(*a)[0], setup.state, setup.frozen,
                            vae_state, latents, cond, key, inputs)
    scale = lambda s: (rows,) + tuple(s.shape[1:])
    data = {name: jax.ShapeDtypeStruct(scale(fields[name]), fields[name].dtype,
                                       sharding=setup.batch_sharding())
            for name in algo.train_fields}
    data["cond"] = {k: jax.ShapeDtypeStruct(scale(v), v.dtype, sharding=setup.batch_sharding())
                    for k, v in cond.items()}
    data["advantage"] = _rows(setup, {"a": (rows,)})["a"]
    eta = jax.ShapeDtypeStruct((), jnp.float32)
    update = compile_program(fns["update"], setup.state, setup.frozen, data, key, eta, shared)
    update["batch_bytes"] = per_device_bytes(data)
    rollout["vae_bytes"] = per_device_bytes(vae_state)
    rollout["chunk_bytes"] = per_device_bytes((latents, cond, inputs))  # this chunk's rows
    return rollout, update, {"global_batch": rows, "rollout_chunk": chunk,
                             "micro_batches": layout[0], "optimize_chunks": layout[2],
                             "mu_iterations": run.mu_iterations}


def _vae_state(setup):
    from flax import nnx

    from wfm_jax.plan.abstract import placed
    return placed(setup.pipe.vae, setup.mesh, setup.rules, nnx.Variable)
