"""What the RL loop needs before its first step: the shared train setup (setup.build), the
algorithm object, prompt batches, rewards, and the jit-compiled rollout / update / evaluate.

Fail-fast order: prompt files and the reward service are checked before the model is loaded
or anything is compiled.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reward_client.computer import RewardComputer
from wfm_jax.data.groups import eval_batches, group_batcher_from_config
from wfm_jax.data.loader import process_shard
from wfm_jax.data.prompts import prompt_splits_from_config
from wfm_jax.core.mesh import mesh_jit, mesh_size_for
from wfm_jax.sampling.samplers import sample
from wfm_jax.train import setup as train_setup
from wfm_jax.programs.ema import ema_update
from wfm_jax.programs.encode import TextEncoder
from wfm_jax.train.metrics import MetricsLogger
from wfm_jax.programs.optim import apply_gradients
from wfm_jax.train.rl_ddrl import DDRL
from wfm_jax.programs.rl_encode import chunk_conditions
from wfm_jax.train.rl_grpo import GRPO
from wfm_jax.train.rl_nft import NFT

# Algorithm objects: init_aux, rollout, final_latents, train_fields, grads, post_update_decay,
# post_update; optional hooks: records(config) (a dataset other than prompt files),
# prepare(run) -> arrays passed to every rollout / update as keywords, chunk_inputs(run,
# batch, lo, hi) -> per-row rollout inputs, advantages(rewards, groups), moves_reference(config),
# keeps_old (grads takes old= / first= and returns per-row values kept across inner epochs).
ALGORITHMS = {"nft": NFT, "grpo": GRPO, "ddrl": DDRL}


def reward_config(config) -> dict:
    """train.train_policy.remote_reward -> RewardComputer.from_config's mapping."""
    rr = config.train.train_policy.remote_reward
    fns = []
    for fn in rr.reward_fns:
        spec = {"name": fn["name"], "weight": float(fn.get("weight", 1.0))}
        if fn.get("score_key"):
            spec["score_key"] = fn["score_key"]
        spec.update({k: float(fn[k]) for k in ("clip_min", "clip_max") if fn.get(k) is not None})
        if not config.train.train_policy.use_remote_reward:
            spec["local"] = True
        fns.append(spec)
    out = {"reward_fns": fns, "scale": rr.scale, "clip": rr.clip,
           "on_failure": rr.on_failure, "media_type": rr.media_type}
    if config.train.train_policy.use_remote_reward:
        remote = {k: v for k, v in (("enqueue_url", rr.enqueue_url), ("fetch_url", rr.fetch_url),
                                    ("token", rr.token)) if v}
        remote["budget_s"] = float(rr.budget_s)
        out["remote"] = remote
    return out


def make_velocity(graphdef, frozen, family):
    """velocity(params, x, timesteps, cond) of the family's transformer with `params` trained.
    It carries the family's CFG form as `velocity.guide` (rl_grpo.guide_of), so the algorithms
    guide as the family does without knowing it. family: a shell (PipelineFamily.shell())."""
    def velocity(params, x, t, cond):
        return family.velocity_with(nnx.merge(graphdef, params, frozen), x, t, cond)
    velocity.guide = family.guide
    return velocity


@dataclasses.dataclass
class RLRun:
    config: Any
    setup: Any
    algo: Any
    rewards: RewardComputer
    batcher: Any
    val_records: list
    logger: MetricsLogger
    micro_batches: int
    rollout_chunk: int
    max_steps: int
    global_batch: int
    seed: int
    output_dir: str
    base_key: Any = None
    text_encoder: Any = None
    mu_iterations: int = 1   # inner epochs over each rollout batch
    optimize_chunks: int = 1  # optimizer steps per inner epoch (batch_size_per_optimize)
    row_shards: int = 1      # devices the batch rows are split over
    shared: dict = dataclasses.field(default_factory=dict)  # algo.prepare's arrays
    _fns: dict = dataclasses.field(default_factory=dict)

    # -- loop-facing attributes --
    @property
    def state(self):
        return self.setup.state

    @property
    def start_step(self) -> int:
        return self.setup.start_step

    @property
    def global_std(self) -> bool:
        return bool(self.config.train.train_policy.global_std)

    @property
    def std_ddof(self) -> int:
        return int(self.config.train.train_policy.std_ddof)

    @property
    def adv_range(self) -> tuple[float, float]:
        tp = self.config.train.train_policy
        return float(tp.advantage_low), float(tp.advantage_high)

    @property
    def validation_enabled(self) -> bool:
        return bool(self.config.validation.enable) and bool(self.val_records)

    @property
    def val_before_train(self) -> bool:
        return bool(self.config.validation.val_before_train)

    @property
    def validation_freq(self) -> int:
        return int(self.config.validation.freq)

    # -- model calls --
    def encode(self, prompts, negative: bool = False) -> dict:
        """The conditioning of `prompts` (negative: of CFG's unconditional branch)."""
        ids = self.setup.global_batch(self.text_encoder.tokenize(prompts, negative))
        return self.text_encoder(ids)

    def chunk_conditions(self, prompts) -> list[dict]:
        """run.encode of each rollout chunk of `prompts`, each distinct prompt encoded once."""
        return chunk_conditions(self, list(prompts), self.rollout_chunk)

    def initial_latents(self, key, n: int, evaluation: bool = False):
        """Noise for n rows: rollouts (training data) have train_frames frames, validation
        samples inference_frames (video families; cosmos-rl's SANA-Video rollout ignored
        train_frames and always sampled 81)."""
        d = self.config.policy.diffusers
        h, w = d.inference_size
        frames = d.inference_frames if evaluation else d.train_frames
        shape = self.setup.pipe.latent_shape(n, int(h), int(w), frames=int(frames))
        return _normal(key, shape, self.setup.batch_sharding())

    def rollout(self, state, latents, cond, key, inputs: dict | None = None):
        return self._fns["rollout"](state, self.setup.frozen, nnx.state(self.setup.pipe.vae),
                                    latents, cond, key, dict(self.shared, **(inputs or {})))

    def chunk_inputs(self, batch: dict, lo: int, hi: int) -> dict:
        """The algorithm's extra per-row rollout inputs for rows lo:hi (e.g. DDRL's data)."""
        fn = getattr(self.algo, "chunk_inputs", None)
        return fn(self, batch, lo, hi) if fn is not None else {}

    def evaluate(self, state, latents, cond):
        """-> (final latents, pixels in [0, 1])."""
        return self._fns["evaluate"](state, self.setup.frozen, nnx.state(self.setup.pipe.vae),
                                     latents, cond, self._uncond(latents.shape[0]))

    def _uncond(self, n: int):
        if float(self.config.policy.diffusers.sample.guidance_scale) <= 1.0:
            return None
        return self.encode([""] * n, negative=True)

    def dispatch_update(self, state, rollout: dict, adv: np.ndarray, key, step: int):
        """Dispatch the algorithm's update -> (new state, pending metrics on the device, their
        host copy started); nothing waits for the device here."""
        data = {name: rollout[name] for name in self.algo.train_fields}
        data["cond"] = rollout["cond"]
        data["advantage"] = self.setup.global_batch(np.asarray(adv, np.float32))
        eta = self.algo.post_update_decay(step)
        state, metrics = self._fns["update"](state, self.setup.frozen, data, key, jnp.float32(eta),
                                             self.shared)
        self.setup.state = state
        pending = (metrics, state.step)
        for leaf in jax.tree.leaves(pending):
            leaf.copy_to_host_async()
        return state, (pending, eta)

    def update_metrics(self, pending) -> dict:
        """The step's update metrics, host floats: the step's one wait for the device."""
        (metrics, count), eta = jax.device_get(pending[0]), pending[1]
        out = {f"train/{k}": float(v) for k, v in metrics.items()}
        out["train/old_policy_decay"] = eta
        # the rate of the last optimizer update (several per step: mu_iterations x chunks)
        out["train/learning_rate"] = float(self.setup.lr_schedule(int(count) - 1))
        return out

    def validation_batches(self):
        dp = batch_shards(self.setup)
        size = -(-int(self.config.validation.batch_size) // dp) * dp  # padded rows are not scored
        return eval_batches(self.val_records, size, process_shard())

    def save(self, state, step: int, final: bool = False, export: bool = True) -> None:
        self.setup.state = state
        if final and self.setup.checkpointer.latest_step() == step:
            return  # the regular save at this step already happened
        data_state = self.batcher.state()
        saved = self.setup.save(step, data_state=data_state, force=final)
        if saved and export and self.config.train.ckpt.export_safetensors:
            from wfm_jax.train.export import export_step
            export_step(self.setup, step)

    def close(self) -> None:
        self.setup.close()
        self.logger.close()
        self.rewards.close()


def batch_shards(setup) -> int:
    """How many ways the batch axis is split on this run's mesh (its rules: data x fsdp)."""
    return mesh_size_for(setup.mesh, "act_batch", setup.rules)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, sharding):
    return jax.lax.with_sharding_constraint(jax.random.normal(key, shape, jnp.float32), sharding)


def pixels_to_uint8(pixels):
    """[0, 1] float pixels -> uint8 on the device, rounded as image_grid.to_uint8 does: the
    blocking fetch of each rollout chunk's images moves 4x fewer bytes."""
    return jnp.round(jnp.clip(pixels.astype(jnp.float32), 0.0, 1.0) * 255).astype(jnp.uint8)


def _compile(run: RLRun) -> dict:
    """The jitted rollout, update and evaluation functions of this run."""
    s, algo, cfg = run.setup, run.algo, run.config
    graphdef, vae_def = s.graphdef, nnx.graphdef(s.pipe.vae)
    family = s.pipe.shell()
    train = cfg.train
    # evaluation samples as the family's diffusers pipeline does (SD3: Euler; Wan and Cosmos:
    # UniPC; SANA: DPM-Solver++), on the family's own noise range (Cosmos: its Karras sigmas)
    eval_method = s.pipe.default_solver
    eval_sigmas, eval_timesteps = s.pipe.flow_schedule(
        int(cfg.policy.diffusers.sample.eval_num_steps), eval_method)
    eval_sigmas = jnp.asarray(eval_sigmas, jnp.float32)
    guidance = float(cfg.policy.diffusers.sample.guidance_scale)

    def decode(vae_state, latents):
        return family.decode_with(nnx.merge(vae_def, vae_state), latents)

    # Every jit traces under the mesh (the models' activation constraints act only there) and
    # returns fixed shardings: the updated state comes back exactly as it went in, so step 2
    # compiles nothing.
    row_sharding, rep = s.batch_sharding(), train_setup.replicated(s.mesh)
    on_mesh = functools.partial(mesh_jit, mesh=s.mesh, rules=s.rules)

    @on_mesh(out_shardings=(row_sharding, row_sharding))
    def rollout(state, frozen, vae_state, latents, cond, key, inputs):
        fields = algo.rollout(make_velocity(graphdef, frozen, family), state, latents, cond, key, **inputs)
        return fields, pixels_to_uint8(decode(vae_state, algo.final_latents(fields)))

    @on_mesh(out_shardings=(row_sharding, row_sharding))
    def evaluate(state, frozen, vae_state, latents, cond, uncond):
        params = state.params if state.ema is None else state.ema
        velocity = make_velocity(graphdef, frozen, family)
        out = sample(lambda x, t, c: velocity(params, x, t, c), latents, eval_sigmas,
                     method=eval_method, cond=cond, uncond=uncond, cfg_scale=guidance,
                     timesteps=eval_timesteps, guide=family.guide)
        return out.latents, decode(vae_state, out.latents)  # latents: media_type "latent"

    n_micro, n_epochs = run.micro_batches, run.mu_iterations
    n_chunks = run.optimize_chunks  # optimizer updates per inner epoch
    shards = run.row_shards  # devices the batch rows are split over
    keeps_old = getattr(algo, "keeps_old", False)

    @on_mesh(donate_argnums=(0,), out_shardings=(s.shardings, rep))
    def update(state, frozen, data, key, eta, shared):
        velocity = make_velocity(graphdef, frozen, family)
        ref_params = state.aux.get("ref")
        if ref_params is None:  # LoRA: the reference is the base model, adapters zeroed
            ref_params = jax.tree.map(jnp.zeros_like, state.params)
        # micro-batch j takes rows j, j + n_micro, ...: every micro-batch spans all devices
        micro = jax.tree.map(lambda x: jnp.swapaxes(
            x.reshape((x.shape[0] // n_micro, n_micro) + x.shape[1:]), 0, 1), data)

        def grads_of(state, batch, k, old, first):
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

    return {"rollout": rollout, "evaluate": evaluate, "update": update}


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


def _check_layout(config, setup) -> tuple[int, int, int]:
    """(micro-batches per step, rollout chunk, optimizer steps per inner epoch) with clear
    errors when the numbers don't divide."""
    t = config.train
    dp = batch_shards(setup)
    global_batch = int(t.train_batch_per_replica)
    micro = int(t.train_policy.mini_batch) * dp
    if global_batch % micro:
        raise train_setup.SetupError(
            f"train_batch_per_replica={global_batch} is not a multiple of train_policy.mini_batch="
            f"{t.train_policy.mini_batch} x {dp} data-parallel devices")
    per_optimize = t.train_policy.batch_size_per_optimize
    if per_optimize is not None and (per_optimize % micro or global_batch % per_optimize):
        raise train_setup.SetupError(
            f"train_policy.batch_size_per_optimize={per_optimize} must divide "
            f"train_batch_per_replica={global_batch} and be a multiple of train_policy.mini_batch="
            f"{t.train_policy.mini_batch} x {dp} data-parallel devices")
    chunk = micro // jax.process_count()
    return global_batch // micro, chunk, train_setup.rl_optimize_chunks(config)


def build(config) -> RLRun:
    algo_cls = ALGORITHMS.get(config.train.train_policy.type)
    if algo_cls is None:
        raise train_setup.SetupError(
            f"train.train_policy.type={config.train.train_policy.type!r} has no RL trainer yet; "
            f"available: {sorted(ALGORITHMS)}")
    # the model first: without it nothing else matters (a missing model dir was once reported
    # as a missing reward service), then the data, then the rewards
    train_setup.check_video_flag(config)
    train_setup.ensure_tiny_assets(config)
    train_setup.check_model_dir(config)
    records_fn = getattr(algo_cls, "records", None)
    train_records, val_records = (records_fn(config) if records_fn is not None
                                  else prompt_splits_from_config(config))
    rewards = RewardComputer.from_config(reward_config(config))
    rewards.check_reachable(budget_s=10.0)  # fail fast, before any model is loaded or compiled
    # The KL reference: LoRA off (zeros, made inside the update), or for a full fine-tune the
    # starting weights, kept in the checkpointed state so a resumed run still has them.
    # An algorithm whose reference follows the policy (DDRL update_ref_every_iter) keeps it
    # there under LoRA too.
    moves = getattr(algo_cls, "moves_reference", None)
    keep_ref = config.train.train_policy.kl_beta > 0 and (
        not config.policy.lora.enable or (moves is not None and moves(config)))

    def aux_fn(params):
        return dict(algo_cls.init_aux(params), **({"ref": params} if keep_ref else {}))

    setup = train_setup.build(config, aux_fn=aux_fn)
    algo = algo_cls(config, setup.pipe.shell())
    micro_batches, chunk, optimize_chunks = _check_layout(config, setup)
    batcher = group_batcher_from_config(config, train_records,
                                        data_parallel=batch_shards(setup))
    if setup.data_state:
        batcher.restore(setup.data_state)
    logger = MetricsLogger(config.train.output_dir, total_steps=config.train.max_steps,
                           wandb_cfg=config.train.wandb.to_dict(), start_step=setup.start_step)
    run = RLRun(config, setup, algo, rewards, batcher, val_records, logger, micro_batches,
                chunk, int(config.train.max_steps), int(config.train.train_batch_per_replica),
                int(config.train.seed), config.train.output_dir,
                base_key=jax.random.key(config.train.seed))
    run.text_encoder = TextEncoder(setup.pipe, config.policy.diffusers.max_prompt_length,
                                   out_sharding=setup.batch_sharding())
    run.mu_iterations = int(config.train.train_policy.mu_iterations)
    run.optimize_chunks = optimize_chunks
    run.row_shards = batch_shards(setup)
    prepare = getattr(algo, "prepare", None)
    run.shared = prepare(run) if prepare is not None else {}
    run._fns = _compile(run)
    return run
