"""Everything a training loop needs before its first step, from one config; loop-agnostic.

    setup = build(config)          # distributed init, mesh, pipeline on the mesh, LoRA, split,
                                   # optimizer, TrainState (fresh or resumed), Checkpointer
    model = setup.merge(params)    # inside a jit: the transformer with these trained params
    setup.save(step, data_state=...)   # checkpoint (every train.ckpt.save_freq steps)

The transformer is split ONCE into (graphdef, trainable, frozen) with
`nnx.split(model, nnx.LoRAParam | nnx.Param, ...)`: `trainable` lives in `state.params` (and its
EMA / optimizer moments), `frozen` stays outside the state (base weights under LoRA, buffers),
and train steps are plain `jax.jit` functions that call `merge` inside. Shardings are explicit:
parameters follow the mesh rules (FSDP over `fsdp`), batches split over (data, fsdp).

`pipe.trainable_module()` is consumed by the split (its trained variables now live in the state only):
use `setup.merge(params)` for the model.

TrainState (wfm_jax.programs.state) holds step, params (trainable), opt_state, ema (or None), rng
(typed key) and aux (named extra copies, e.g. the RL "old" policy: `aux_fn=lambda p: {"old": p}`);
all of it is checkpointed, plus each process's data-iterator state and a JSON `extra`.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding

from wfm_jax.core import mesh as wmesh
from wfm_jax.core.console import say
from wfm_jax.families import base as family_lib
from wfm_jax.families.base import PipelineError, PipelineFamily
from wfm_jax.models import lora as lora_lib
from wfm_jax.models.options import ModelOptions

# the pure pieces live with the programs (the planner builds an abstract setup from them); the
# trainer's callers keep reading them here
from wfm_jax.programs.setup import (  # noqa: F401
    DTYPES,
    SetupError,
    batch_sharding,
    ema_active,
    ensure_tiny_assets,
    global_batch,
    make_tx,
    merge,
    replicated,
    rl_optimize_chunks,
    schedule_total_steps,
    split_model,
    state_init,
    state_shardings,
    trainable_filter,
    with_shardings,
)
from wfm_jax.programs.state import TrainState
from wfm_jax.train.checkpoint import Checkpointer, Restored

MODEL_FLAG = "--config.policy.model_name_or_path"


# ----------------------------------------------------------------------------- pieces

def init_distributed(config) -> bool:
    """jax.distributed from config.distributed.* (None: JAX_* env); True when multi-process."""
    d = config.distributed
    try:
        return wmesh.maybe_initialize_distributed(d.coordinator_address, d.num_processes,
                                                  d.process_id)
    except ValueError as e:
        raise SetupError(f"distributed: {e}") from e


def build_mesh(config) -> jax.sharding.Mesh:
    try:
        return wmesh.make_mesh(config.policy.parallelism)
    except ValueError as e:
        raise SetupError(f"policy.parallelism: {e}") from e


def check_model_dir(config) -> str:
    """The model dir, or a SetupError telling the user how to give one."""
    path = config.policy.model_name_or_path
    if not path or not os.path.isdir(path):
        want = family_lib.families().get(config.policy.family, config.policy.family)
        raise SetupError(f"model directory not found: '{path}'; pass a local diffusers {want} "
                         f"directory with {MODEL_FLAG}=DIR")
    return path


def check_video_flag(config) -> None:
    """policy.diffusers.is_video must say what the recipe's family is (before any loading)."""
    try:
        cls = family_lib.family_named(config.policy.family)
    except family_lib.PipelineError as e:
        raise SetupError(f"policy.family: {e}") from e
    if bool(config.policy.diffusers.is_video) != cls.is_video:
        raise SetupError(
            f"policy.diffusers.is_video={bool(config.policy.diffusers.is_video)}: the "
            f"{cls.family!r} family ({cls.pipeline_class}) is "
            f"{'a video' if cls.is_video else 'an image'} model")


def load_pipeline(config, mesh=None, rules=None) -> PipelineFamily:
    """The pipeline in policy.model_name_or_path, which must be of the recipe's policy.family
    (one line naming its class otherwise)."""
    ensure_tiny_assets(config)
    path = check_model_dir(config)
    try:
        return family_lib.load_pipeline(
            path, family=config.policy.family, dtype=DTYPES[config.train.compute_dtype],
            param_dtype=DTYPES[config.train.param_dtype], mesh=mesh, rules=rules,
            text_dtype=DTYPES[config.train.compute_dtype],
            frozen_param_dtype=DTYPES[config.train.compute_dtype],
            options=ModelOptions.from_policy(config.policy))
    except (PipelineError, FileNotFoundError) as e:
        raise SetupError(f"{e} ({MODEL_FLAG})") from e


def check_context_split(config, pipe, mesh, rules) -> None:
    """Ulysses needs the attention heads (per act_heads shard) to divide by the context split:
    one line before anything compiles (a sequence that does not divide is padded, and "auto"
    takes the ring when the heads do not divide)."""
    n = wmesh.mesh_size_for(mesh, "act_seq", rules)
    heads = pipe.transformer_config.get("num_attention_heads")
    if config.policy.context_parallel_impl != "ulysses" or n == 1 or heads is None:
        return
    local, rem = divmod(int(heads), wmesh.mesh_size_for(mesh, "act_heads", rules))
    if rem or local % n:
        raise SetupError(f"policy.context_parallel_impl='ulysses' splits the sequence {n} ways "
                         f"(policy.parallelism.context) but the transformer's {heads} attention "
                         f"heads do not divide by it; use 'ring' or 'auto'")


def checkpoints_path(config) -> str:
    return os.path.join(config.train.output_dir, "checkpoints")


def checkpoint_steps(config) -> list[int]:
    """The finished checkpoint steps in output_dir (orbax's temporaries are not digits)."""
    directory = checkpoints_path(config)
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def check_fresh_output(config) -> None:
    """Without train.resume, an output dir that already holds checkpoints is an error (checked
    before anything, e.g. config.json, is written there)."""
    directory = checkpoints_path(config)
    if config.train.resume:
        return
    steps = checkpoint_steps(config)
    if steps:
        raise SetupError(f"{directory} already holds checkpoints (latest step {steps[-1]}); pass "
                         f"--config.train.resume=True to continue or choose a new "
                         f"train.output_dir")


def place(value: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """Put a host-identical value into its shards (every process holds the same value)."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = jax.device_get(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def add_lora_from_config(model: nnx.Module, config, mesh, rules=None) -> list[str]:
    """Attach policy.lora to `model` and put the new parameters into their shards."""
    cfg = config.policy.lora
    try:
        paths = lora_lib.attach_lora(model, cfg.target_modules, cfg.r, cfg.lora_alpha,
                                     seed=config.train.seed, init=cfg.init_lora_weights)
    except lora_lib.LoraError as e:
        raise SetupError(str(e)) from e
    shardings = wmesh.param_shardings(model, mesh, rules, filter=nnx.LoRAParam)
    for path, var in nnx.state(model, nnx.LoRAParam).flat_state():
        var.set_value(place(var.get_value(), shardings[".".join(str(p) for p in path)]))
    return paths


# ----------------------------------------------------------------------------- the whole setup

@dataclasses.dataclass
class TrainSetup:
    config: Any
    mesh: jax.sharding.Mesh
    rules: Any
    pipe: PipelineFamily
    graphdef: Any            # transformer structure (static)
    frozen: Any              # nnx.State of the untrained transformer variables
    param_shardings: Any     # pytree of NamedShardings matching state.params
    tx: optax.GradientTransformation
    lr_schedule: Callable    # update count (0-based) -> learning rate
    state: TrainState
    shardings: TrainState    # NamedSharding of every state leaf (jit in/out shardings)
    checkpointer: Checkpointer
    start_step: int          # optimizer steps already done (restored step, else 0)
    data_state: dict | None  # this process's restored data-iterator state
    extra: dict              # restored JSON extra ({} on a fresh start)
    lora: bool
    lora_targets: list
    s3: Any = None           # S3Sync uploading checkpoints / exports (train.ckpt.upload_s3)

    @property
    def is_primary(self) -> bool:
        return jax.process_index() == 0

    def merge(self, params, frozen=None) -> nnx.Module:
        """The transformer with `params` as its trained variables (call inside a jit)."""
        return merge(self.graphdef, params, self.frozen if frozen is None else frozen)

    def batch_sharding(self) -> NamedSharding:
        return batch_sharding(self.mesh, self.rules)

    def global_batch(self, tree: Any) -> Any:
        return global_batch(tree, self.mesh, self.rules)

    def vae_state(self):
        return nnx.state(self.pipe.vae)

    def save(self, step: int, data_state: dict | None = None, extra: dict | None = None,
             force: bool = False) -> bool:
        """Checkpoint `self.state` at `step` if due (train.ckpt.save_freq) or forced."""
        due = force or self.checkpointer.should_save(step)
        if self.s3 is not None and due:  # max_keep must not delete a step before its upload
            self.s3.wait_uploaded("checkpoints", self.checkpointer.removed_by_saving(step))
        started = self.checkpointer.save(step, self.state, extra=extra, data_state=data_state,
                                         force=force)
        if self.s3 is not None and started:
            self.s3.checkpoint_saved(step)
        return started

    def close(self) -> None:
        self.checkpointer.close()
        if self.s3 is not None:  # after the checkpointer: every step dir is final now
            s3, self.s3 = self.s3, None
            s3.finish()


def build(config, *, aux_fn: Callable[[Any], dict] | None = None, pipe: PipelineFamily | None = None,
          checkpoint_dir: str | None = None) -> TrainSetup:
    """Build (or resume, when train.resume and a checkpoint exists) the training state.

    aux_fn(params) -> dict of extra arrays kept in TrainState.aux (copied, checkpointed);
    entries shaped like params are sharded like them. `pipe` skips loading (tests).
    """
    init_distributed(config)
    mesh = build_mesh(config)
    rules = wmesh.active_rules()
    if pipe is None:
        pipe = load_pipeline(config, mesh, rules)
        check_context_split(config, pipe, mesh, rules)
    use_lora = bool(config.policy.lora.enable)
    model = pipe.trainable_module()  # the family names it (not always `transformer`)
    targets = add_lora_from_config(model, config, mesh, rules) if use_lora else []
    graphdef, trainable, frozen = split_model(model, use_lora)
    del model
    param_shardings = jax.tree.map(lambda x: x.sharding, trainable)
    tx, schedule = make_tx(config)
    init = state_init(config, tx, aux_fn)

    rng = place(jax.random.key(config.train.seed), replicated(mesh))
    abstract = jax.eval_shape(init, trainable, rng)
    shardings = state_shardings(abstract, param_shardings, mesh, tx)

    if jax.process_index() == 0:  # a kill during an export leaves its temporary behind
        from wfm_jax.train.export import remove_stale_temporaries
        stale = remove_stale_temporaries(config.train.output_dir)
        if stale:
            say(f"removed {len(stale)} half-written export(s) a killed run left in "
                f"{config.train.output_dir}/safetensors: {', '.join(stale)}")
    from wfm_jax.train.s3_sync import S3Sync, fetch_resume_checkpoint
    if checkpoint_dir is None:  # train.resume, nothing local: the newest committed S3 step
        fetch_resume_checkpoint(config)
    directory = checkpoint_dir or checkpoints_path(config)
    ckpt = Checkpointer(directory, max_keep=config.train.ckpt.max_keep,
                        save_freq=config.train.ckpt.save_freq,
                        async_=config.train.ckpt.save_mode == "async")
    restored: Restored | None = None
    if config.train.resume:
        restored = ckpt.restore_latest(with_shardings(abstract, shardings))
    elif ckpt.latest_step() is not None:
        ckpt.close()
        raise SetupError(f"{directory} already holds checkpoints (latest step "
                         f"{ckpt.latest_step()}); pass --config.train.resume=True to continue "
                         f"or choose a new train.output_dir")
    if restored is not None:
        state, start, data_state, extra = (restored.state, restored.step, restored.data_state,
                                           restored.extra)
        say(f"resuming from step {start} (checkpoint {directory}/{start})")
        for leaf in jax.tree.leaves(trainable):
            leaf.delete()
    else:  # the trained variables move into the state (donated): no second copy of them
        state = jax.jit(init, out_shardings=shardings, donate_argnums=0)(trainable, rng)
        start, data_state, extra = 0, None, {}
    del trainable
    if jax.process_index() == 0:  # the run has started: now config.json may describe it
        from wfm_jax.config.recipe import save_resolved
        save_resolved(config, os.path.join(config.train.output_dir, "config.json"))
    try:
        uploader = S3Sync.from_config(config)
    except BaseException:
        ckpt.close()
        raise
    return TrainSetup(config, mesh, rules, pipe, graphdef, frozen, param_shardings, tx, schedule,
                      state, shardings, ckpt, int(start), data_state, extra, use_lora, targets,
                      uploader)
