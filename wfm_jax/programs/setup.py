"""What a compiled program is built from: the `Setup` protocol that the trainer's real setup
(train.setup.TrainSetup) and the planner's / benchmark's weightless one (programs.abstract)
both satisfy, and the pure pieces both assemble it with (the trainable split, the optimizer,
the train state's shardings)."""
from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.algorithms.base import Velocity
from wfm_jax.core import mesh as wmesh
from wfm_jax.data.records import ensure_tiny_dataset, primary_builds
from wfm_jax.families.base import family_named
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.programs.optim import make_lr_schedule, make_optimizer, optimizer_updates
from wfm_jax.programs.state import TrainState

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class SetupError(RuntimeError):
    """A run that cannot start (missing model dir, bad mesh, checkpoints in the way); one line."""


class Setup(Protocol):
    """What programs.build reads: the recipe, the mesh and its rules, the family pipeline (real
    or a weightless shell), the trained model's split and the train state with its shardings.
    `state` holds arrays (training) or ShapeDtypeStructs carrying their shardings (planning)."""
    config: Any
    mesh: jax.sharding.Mesh
    rules: Any
    pipe: Any
    graphdef: Any
    frozen: Any
    tx: optax.GradientTransformation
    state: TrainState
    shardings: TrainState

    def batch_sharding(self) -> NamedSharding: ...

    def vae_state(self) -> Any: ...


def ensure_tiny_assets(config) -> None:
    """policy.build_tiny / train.train_policy.dataset.build_tiny: generate the tiny random
    pipeline / shapes dataset at their configured paths when absent (embedded recipes)."""
    path = config.policy.model_name_or_path
    if config.policy.build_tiny and path:
        from wfm_jax.families.tiny import build_tiny_pipeline
        family = config.policy.family
        name = family_named(family).display_name or family
        primary_builds(path, lambda p: build_tiny_pipeline(p, seed=0, family=family),
                        f"the tiny random {name} pipeline (policy.build_tiny)")
    if config.policy.build_tiny_pretrained and path and not os.path.isdir(path):
        # the build trains with this package's SFT loop, so the CLI runs it before training
        # (wfm_jax.cli.main.build_pretrained); a caller of the loops builds it the same way
        raise SetupError(f"the pretrained shapes pipeline {path} is not built: "
                         f"python -m wfm_jax.tiny --pretrained {path}")
    ensure_tiny_dataset(config)


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh, rules=None) -> NamedSharding:
    """Leading (batch) axis split over the mesh axes act_batch maps to (data x fsdp)."""
    return NamedSharding(mesh, wmesh.logical_to_spec(("act_batch",), rules))


def global_batch(tree: Any, mesh, rules=None) -> Any:
    """This process's rows (numpy) -> global arrays split over the batch axes of the mesh."""
    sharding = batch_sharding(mesh, rules)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), tree)


def batch_shards(setup: Setup) -> int:
    """How many ways the batch axis is split on this run's mesh (its rules: data x fsdp)."""
    return wmesh.mesh_size_for(setup.mesh, "act_batch", setup.rules)


def trainable_filter(lora: bool):
    """LoRA params only, or every Param except persistent buffers (full fine-tune)."""
    return nnx.LoRAParam if lora else nnx.All(nnx.Param, nnx.Not(Buffer))


def split_model(model: nnx.Module, lora: bool):
    """(graphdef, trainable, frozen) with `trainable_filter(lora)` selecting the trained part."""
    return nnx.split(model, trainable_filter(lora), ...)


def merge(graphdef, trainable, frozen) -> nnx.Module:
    return nnx.merge(graphdef, trainable, frozen)


def rl_optimize_chunks(config) -> int:
    """Optimizer updates per RL inner epoch: the global batch over batch_size_per_optimize."""
    per_optimize = config.train.train_policy.batch_size_per_optimize
    if per_optimize is None:
        return 1
    return max(1, int(config.train.train_batch_per_replica) // int(per_optimize))


def schedule_total_steps(config) -> int | None:
    """The cosine schedule's length: the optimizer updates the whole run applies (None for a
    constant rate). An SFT loop step is one update (grad_accum_steps micro-steps); an RL loop
    step calls the optimizer once per chunk of batch_size_per_optimize rows (one chunk when
    unset) in each inner epoch (mu_iterations), and with grad_accum_steps > 1 every call is a
    micro-step of an accumulation window."""
    t = config.train
    if t.lr_schedule != "cosine":
        return None
    if t.max_steps is None:  # a trainer resolves it from its data first (config/run_length.py)
        raise SetupError("train.lr_schedule='cosine' needs the run's length, but train.max_steps "
                         "is not resolved yet (config.run_length.resolve_max_steps)")
    accum = int(t.grad_accum_steps)
    calls = accum if t.train_policy.type == "sft" else (
        int(t.train_policy.mu_iterations) * rl_optimize_chunks(config))
    return optimizer_updates(int(t.max_steps), calls, accum)


def with_stand_in_length(config):
    """The config a weightless setup (the planner, the benchmark) builds from: where
    train.max_steps is unset (a run resolves it from its training set, config/run_length.py),
    a copy with a stand-in length that gives a valid schedule; the optimizer's state, its
    shardings and the programs' shapes do not depend on it."""
    if config.train.max_steps is not None:
        return config
    config = copy.deepcopy(config)
    config.train.max_steps = (int(config.train.optm_warmup_steps) + 1) * int(config.train.grad_accum_steps)
    return config


def make_tx(config) -> tuple[optax.GradientTransformation, Callable]:
    """(optimizer, lr schedule over the update count) from train.optm_*."""
    t = config.train
    total = schedule_total_steps(config)
    if total is not None and total <= t.optm_warmup_steps:
        raise SetupError(f"train.lr_schedule='cosine': train.optm_warmup_steps="
                         f"{t.optm_warmup_steps} leaves nothing of the run's {total} optimizer "
                         f"updates (train.max_steps x inner epochs x updates per epoch / "
                         f"train.grad_accum_steps)")
    kw = dict(warmup_steps=t.optm_warmup_steps, schedule=t.lr_schedule, total_steps=total)
    tx = make_optimizer(t.optm_lr, weight_decay=t.optm_weight_decay, betas=tuple(t.optm_betas),
                        eps=t.optm_eps, grad_norm_clip=t.optm_grad_norm_clip,
                        grad_accum_steps=t.grad_accum_steps, **kw)
    return tx, make_lr_schedule(t.optm_lr, **kw)


def ema_active(config) -> bool:
    """EMA is kept (and exported) when enabled with an update interval > 0 (0 = off)."""
    return bool(config.train.ema_enable) and int(config.train.ema_update_step_interval) > 0


def state_shardings(abstract: TrainState, param_shardings: Any, mesh, tx) -> TrainState:
    """Shardings of every TrainState leaf: params / EMA / param-shaped optimizer leaves and
    param-shaped aux entries like the params, everything else replicated."""
    rep = replicated(mesh)
    opt = optax.tree_map_params(tx, lambda _, s: s, abstract.opt_state, param_shardings,
                                transform_non_params=lambda _: rep,
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    params_def = jax.tree.structure(abstract.params)
    aux = {k: (param_shardings if jax.tree.structure(v) == params_def
               else jax.tree.map(lambda _: rep, v)) for k, v in abstract.aux.items()}
    return abstract.replace(step=rep, params=param_shardings, opt_state=opt,
                            ema=None if abstract.ema is None else param_shardings,
                            rng=rep, aux=aux)


def with_shardings(abstract: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


def state_init(config, tx, aux_fn: Callable[[Any], dict] | None = None) -> Callable:
    """init(params, rng) -> TrainState as the recipe keeps it: EMA when active, the
    algorithm's aux copies (aux_fn) as fresh arrays."""
    ema = ema_active(config)

    def init(params, rng):
        aux = aux_fn(params) if aux_fn is not None else {}
        aux = jax.tree.map(lambda x: jnp.array(x, copy=True), aux)
        return TrainState.create(params, tx, rng, ema=ema, aux=aux)
    return init


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def make_velocity(graphdef, frozen, family) -> Velocity:
    """velocity(params, x, timesteps, cond) of the family's transformer with `params` trained,
    carrying the family's CFG form, so the algorithms guide as the family does without knowing
    it. family: a shell (PipelineFamily.shell())."""
    def velocity(params, x, t, cond):
        return family.velocity_with(nnx.merge(graphdef, params, frozen), x, t, cond)
    return Velocity(velocity, family.guide)
