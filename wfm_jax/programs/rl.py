"""The RL programs the trainer runs, the planner lowers and the benchmark times: an algorithm's
rollout chunk (sample + decode), its update over the whole batch (micro-batches, inner epochs,
optional chunks of batch_size_per_optimize rows, the optimizer, EMA, the algorithm's
post-update) and the evaluation sampler. Every jit traces under the mesh (the models' activation
constraints act only there) and returns fixed shardings: the updated state comes back exactly as
it went in, so step 2 compiles nothing."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from wfm_jax.algorithms.base import RLAlgorithm
from wfm_jax.core.mesh import mesh_jit
from wfm_jax.programs import setup as setup_lib
from wfm_jax.programs.ema import ema_update
from wfm_jax.programs.optim import apply_gradients
from wfm_jax.programs.rl_encode import max_local_groups
from wfm_jax.programs.setup import make_velocity


@dataclasses.dataclass(frozen=True)
class RLLayout:
    """How one loop step's global batch is cut: micro-batches per optimizer step, rows per
    rollout chunk (per process), optimizer steps per inner epoch, inner epochs, and the devices
    the rows are split over."""
    micro_batches: int
    rollout_chunk: int
    optimize_chunks: int
    mu_iterations: int
    row_shards: int
    # rows of the per-step conditioning table per device (its rows' distinct prompts:
    # programs/rl_encode.py); 0: the conditioning is kept per row
    cond_slots: int = 0


def rl_layout(config, setup: setup_lib.Setup) -> RLLayout:
    """The recipe's RLLayout, with one-line SetupErrors when the numbers don't divide."""
    t = config.train
    dp = setup_lib.batch_shards(setup)
    global_batch = int(t.train_batch_per_replica)
    micro = int(t.train_policy.mini_batch) * dp
    if global_batch % micro:
        raise setup_lib.SetupError(
            f"train_batch_per_replica={global_batch} is not a multiple of train_policy.mini_batch="
            f"{t.train_policy.mini_batch} x {dp} data-parallel devices")
    per_optimize = t.train_policy.batch_size_per_optimize
    if per_optimize is not None and (per_optimize % micro or global_batch % per_optimize):
        raise setup_lib.SetupError(
            f"train_policy.batch_size_per_optimize={per_optimize} must divide "
            f"train_batch_per_replica={global_batch} and be a multiple of train_policy.mini_batch="
            f"{t.train_policy.mini_batch} x {dp} data-parallel devices")
    return RLLayout(global_batch // micro, micro // jax.process_count(),
                    setup_lib.rl_optimize_chunks(config), int(t.train_policy.mu_iterations), dp,
                    cond_slots(global_batch, int(config.rollout.n_generation), dp))


def cond_slots(global_batch: int, n_generation: int, shards: int) -> int:
    """The most distinct prompts one device's rows hold: the batch is groups of n_generation
    repeats of a prompt, in order (data.groups.GroupBatcher), each device `global_batch /
    shards` consecutive rows; never more than those rows."""
    local = global_batch // shards
    if n_generation < 1 or global_batch % n_generation:
        return local
    return min(local, max_local_groups(global_batch, n_generation, shards))


def prompt_cond_lookup(mesh, spec_axes):
    """(table, index) -> the rows' conditioning, each device taking its rows' entries from its
    own part of the table (the rows of a micro-batch stay on the device that rolled them out:
    rl_layout's micro-batches and chunk_layout), so nothing moves between devices."""
    spec = P(spec_axes)

    def local(table, index):
        return jax.tree.map(lambda a: jnp.take(a, index, axis=0), table)

    def lookup(table, index):
        return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec), out_specs=spec)(table, index)
    return lookup


def pixels_to_uint8(pixels):
    """[0, 1] float pixels -> uint8 on the device, rounded as io.media.to_uint8 does: the
    blocking fetch of each rollout chunk's images moves 4x fewer bytes."""
    return jnp.round(jnp.clip(pixels.astype(jnp.float32), 0.0, 1.0) * 255).astype(jnp.uint8)


def rl_programs(setup: setup_lib.Setup, algo: RLAlgorithm, layout: RLLayout) -> dict:
    """{"rollout", "update"}: the jitted programs of `algo` on `setup` (its evaluation is
    programs.sample.sample_program), and "rollout_body": the rollout without its decode.

    rollout(state, frozen, vae_state, latents, cond, key, inputs) -> (fields, uint8 pixels)
    update(state, frozen, data, key, eta, shared) -> (state, metrics)   (state donated)
    """
    s, cfg = setup, setup.config
    graphdef, vae_def = s.graphdef, nnx.graphdef(s.pipe.vae)
    family = s.pipe.shell()
    train = cfg.train
    def decode(vae_state, latents):
        return family.decode_with(nnx.merge(vae_def, vae_state), latents)

    row_sharding, rep = s.batch_sharding(), setup_lib.replicated(s.mesh)
    on_mesh = functools.partial(mesh_jit, mesh=s.mesh, rules=s.rules)

    def fields_of(state, frozen, vae_state, latents, cond, key, inputs):
        return algo.rollout(make_velocity(graphdef, frozen, family), state, latents, cond, key, **inputs)

    @on_mesh(out_shardings=(row_sharding, row_sharding))
    def rollout(state, frozen, vae_state, latents, cond, key, inputs):
        fields = fields_of(state, frozen, vae_state, latents, cond, key, inputs)
        return fields, pixels_to_uint8(decode(vae_state, algo.final_latents(fields)))

    # the rollout up to its decode (programs.sample.decode_program): the planner's cut models
    rollout_body = on_mesh(out_shardings=row_sharding)(fields_of)

    n_micro, n_epochs = layout.micro_batches, layout.mu_iterations
    n_chunks = layout.optimize_chunks  # optimizer updates per inner epoch
    shards = layout.row_shards  # devices the batch rows are split over
    keeps_old = algo.keeps_old

    lookup = prompt_cond_lookup(s.mesh, row_sharding.spec[0])

    @on_mesh(donate_argnums=(0,), out_shardings=(s.shardings, rep))
    def update(state, frozen, data, key, eta, shared):
        velocity = make_velocity(graphdef, frozen, family)
        data = dict(data)
        table = data.pop("prompt_cond", None)  # the step's prompts, not cut into micro-batches
        ref_params = state.aux.get("ref")
        if ref_params is None:  # LoRA: the reference is the base model, adapters zeroed
            ref_params = jax.tree.map(jnp.zeros_like, state.params)
        # micro-batch j takes rows j, j + n_micro, ...: every micro-batch spans all devices
        micro = jax.tree.map(lambda x: jnp.swapaxes(
            x.reshape((x.shape[0] // n_micro, n_micro) + x.shape[1:]), 0, 1), data)

        def grads_of(state, batch, k, old, first):
            if table is not None:  # each row's prompt conditioning, from the step's table
                batch = dict(batch)
                batch["cond"] = {**lookup(table, batch.pop("cond_index")), **batch["cond"]}
            if keeps_old:  # per-row "old" values computed on the first inner epoch, kept after
                return algo.grads(velocity, state, ref_params, batch, k, old=old, first=first,
                                  **shared)
            grads, metrics = algo.grads(velocity, state, ref_params, batch, k)
            return grads, metrics, old

        def optimize(state, micro, keys, olds, first: bool):
            """One optimizer step, gradients accumulated over the micro-batches (leading axis
            of `micro`, `keys`, `olds`): their mean."""
            count = keys.shape[0]

            def body(acc, xs):
                batch, k, old = xs
                grads, metrics, old = grads_of(state, batch, k, old, first)
                return jax.tree.map(jnp.add, acc, (grads, metrics)), old

            shapes = jax.eval_shape(lambda: grads_of(
                state, *jax.tree.map(lambda x: x[0], (micro, keys, olds)), first)[:2])
            zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
            (grads, metrics), olds = jax.lax.scan(body, zeros, (micro, keys, olds))
            grads = jax.tree.map(lambda g: g / count, grads)
            metrics = jax.tree.map(lambda m: m / count, metrics)
            params, opt_state, info = apply_gradients(s.tx, state.params, state.opt_state, grads)
            step = state.step + info["updated"].astype(jnp.int32)
            ema = ema_update(state.ema, params, step, train.ema_decay,
                             train.ema_update_step_interval, when=info["updated"])
            state = state.replace(step=step, params=params, opt_state=opt_state, ema=ema)
            metrics["grad_norm"] = info["grad_norm"]
            return state, metrics, olds

        def inner_epoch(state, key, olds, first: bool):
            """The whole batch in one optimizer step."""
            return optimize(state, micro, jax.random.split(key, n_micro), olds, first)

        if n_chunks > 1:
            state, metrics = chunked_epochs(state, key, data, micro, grads_of, optimize)
        else:
            state, metrics, olds = inner_epoch(state, key, None, True)
            first_dev = metrics.get("ratio_abs_dev")  # 0 exactly: the old policy is this forward
            if n_epochs > 1:
                def later(carry, e):
                    state, m, olds = inner_epoch(carry[0], jax.random.fold_in(key, e), carry[1],
                                                 False)
                    return (state, olds), m

                (state, _), rest = jax.lax.scan(later, (state, olds), jnp.arange(1, n_epochs))
                metrics = jax.tree.map(lambda a, r: (a + r.sum(0)) / n_epochs, metrics, rest)
            if first_dev is not None:
                metrics["first_epoch_ratio_abs_dev"] = first_dev
        state = algo.post_update(state, eta)
        return state, metrics

    def chunked_epochs(state, key, data, micro, grads_of, optimize):
        """mu_iterations epochs, each over the batch in a fresh random row order, cut into
        n_chunks optimizer steps (cosmos-rl's batch_size_per_optimize). Metrics (grad_norm
        included) are means over all the steps."""
        if keeps_old:
            # the old values come from the policy that rolled out, for every row, before any
            # step moves it (later chunks of the first epoch must not see an updated policy)
            k_old = jax.random.fold_in(key, n_epochs)

            def old_of(_, xs):
                return None, grads_of(state, xs[0], xs[1], None, True)[2]

            _, olds = jax.lax.scan(old_of, None, (micro, jax.random.split(k_old, n_micro)))
            olds = jax.tree.map(lambda o: jnp.swapaxes(o, 0, 1).reshape(
                (-1,) + o.shape[2:]), olds)  # micro layout -> row order
        else:
            olds = None
        rows = jax.tree.leaves(data)[0].shape[0]
        per_chunk = n_micro // n_chunks

        def epoch(state, e):
            k_perm, k_micro = jax.random.split(jax.random.fold_in(key, e))
            order = shard_local_permutation(k_perm, rows, shards)
            chunks = jax.tree.map(lambda x: chunk_layout(x, order, n_chunks, n_micro, shards),
                                  (data, olds))
            keys = jax.vmap(lambda k: jax.random.split(k, per_chunk))(
                jax.random.split(k_micro, n_chunks))

            def step(state, xs):
                (batch, old), ks = xs
                state, metrics, _ = optimize(state, batch, ks, old, False)
                return state, metrics

            state, metrics = jax.lax.scan(step, state, (chunks, keys))
            return state, jax.tree.map(lambda m: m.mean(0), metrics)

        state, per_epoch = jax.lax.scan(epoch, state, jnp.arange(n_epochs))
        metrics = jax.tree.map(lambda m: m.mean(0), per_epoch)
        if "ratio_abs_dev" in per_epoch:
            metrics["first_epoch_ratio_abs_dev"] = per_epoch["ratio_abs_dev"][0]
        return state, metrics

    return {"rollout": rollout, "update": update, "rollout_body": rollout_body}


def shard_local_permutation(key, rows: int, shards: int):
    """(shards, rows // shards): a random order of each device's own rows (row r of the batch
    lives on device r // (rows // shards)), drawn per device: reordering moves no data between
    devices, and every optimizer step takes the same number of rows from every device."""
    local = rows // shards
    return jax.vmap(lambda k: jax.random.permutation(k, local))(jax.random.split(key, shards))


def chunk_layout(x, order, n_chunks: int, n_micro: int, shards: int):
    """Rows (B, ...) -> (n_chunks, micro-batches per chunk, B // n_micro, ...).

    Each device's rows are put in `order` (shard_local_permutation) and cut into n_chunks
    consecutive runs, one per optimizer step; inside a run micro-batch j takes the device's
    rows j, j + per_chunk, ... (as the unchunked update does), so every micro-batch holds the
    same number of rows from every device and stays split over all of them. With n_chunks 1
    and the identity order this is exactly the unchunked micro-batch layout."""
    rows = x.shape[0]
    local = rows // shards
    per_chunk, per_device = n_micro // n_chunks, local // n_micro
    x = x.reshape((shards, local) + x.shape[1:])
    x = jax.vmap(lambda a, p: a[p])(x, order)
    x = x.reshape((shards, n_chunks, per_device, per_chunk) + x.shape[2:])
    x = jnp.transpose(x, (1, 3, 0, 2) + tuple(range(4, x.ndim)))
    return x.reshape((n_chunks, per_chunk, shards * per_device) + x.shape[4:])
