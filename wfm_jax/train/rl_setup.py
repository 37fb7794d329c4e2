"""What the RL loop needs before its first step: the shared train setup (setup.build), the
algorithm object (algorithms.registry.ALGORITHMS), prompt batches, rewards, and the run's
compiled programs (programs.build: the rollout, update and evaluation the planner lowers too).

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

from reward_client.computer import RewardComputer
from wfm_jax.algorithms.base import AlgorithmConfigError, RLAlgorithm
from wfm_jax.algorithms.registry import ALGORITHMS, algorithm_named
from wfm_jax.config.base import ConfigError
from wfm_jax.config.run_length import resolve_max_steps
from wfm_jax.data.groups import eval_batches, group_batcher_from_config
from wfm_jax.data.loader import process_shard
from wfm_jax.programs import Programs
from wfm_jax.programs import build as build_programs
from wfm_jax.programs.encode import TextEncoder, VisualEncoder
from wfm_jax.programs.rl import RLLayout
from wfm_jax.programs.rl_encode import chunk_conditions, rollout_conditions
from wfm_jax.programs.setup import batch_shards
from wfm_jax.train import setup as train_setup
from wfm_jax.train.metrics import MetricsLogger

__all__ = ["ALGORITHMS", "RLRun", "batch_shards", "build", "reward_config"]


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


@dataclasses.dataclass
class RLRun:
    """The RL loop's run: setup, algorithm, data, rewards and programs. It is the algorithm's
    RolloutContext (rollout_chunk, pipe, encode, place, visual_encoder)."""
    config: Any
    setup: Any
    algo: RLAlgorithm
    rewards: RewardComputer
    batcher: Any
    val_records: list
    logger: MetricsLogger
    layout: RLLayout
    max_steps: int
    global_batch: int
    seed: int
    output_dir: str
    base_key: Any = None
    text_encoder: Any = None
    shared: dict = dataclasses.field(default_factory=dict)  # algo.prepare's arrays
    programs: Programs | None = None
    _visual: Any = None

    # -- loop-facing attributes --
    @property
    def rollout_chunk(self) -> int:
        return self.layout.rollout_chunk

    @property
    def pipe(self):
        return self.setup.pipe

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

    # -- the algorithm's RolloutContext --
    def place(self, tree: Any) -> Any:
        """This process's rows (numpy) -> global arrays split over the batch axes."""
        return self.setup.global_batch(tree)

    def visual_encoder(self):
        """The VAE encoder, its output split over the batch like the rollouts (built once)."""
        if self._visual is None:
            self._visual = VisualEncoder(self.setup.pipe, out_sharding=self.setup.batch_sharding())
        return self._visual

    # -- model calls --
    def encode(self, prompts, negative: bool = False) -> dict:
        """The conditioning of `prompts` (negative: of CFG's unconditional branch)."""
        ids = self.setup.global_batch(self.text_encoder.tokenize(prompts, negative))
        return self.text_encoder(ids)

    def chunk_conditions(self, prompts) -> list[dict]:
        """run.encode of each rollout chunk of `prompts`, each distinct prompt encoded once."""
        return chunk_conditions(self, list(prompts), self.rollout_chunk)

    def rollout_conditions(self, prompts) -> tuple[list[dict], dict]:
        """(chunk_conditions(prompts), the prompts' conditioning the update keeps: one table per
        step, programs.rl_encode.rollout_conditions)."""
        compute = self.config.train.compute_dtype
        return rollout_conditions(self, list(prompts), self.rollout_chunk, self.layout.cond_slots,
                                  self.setup.pipe.cond_storage_dtypes(compute))

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
        return self.programs.rollout(state, self.setup.frozen, self.setup.vae_state(), latents,
                                     cond, key, dict(self.shared, **(inputs or {})))

    def chunk_inputs(self, batch: dict, lo: int, hi: int) -> dict:
        """The algorithm's extra per-row rollout inputs for rows lo:hi (e.g. DDRL's data)."""
        return self.algo.chunk_inputs(self, batch, lo, hi)

    def evaluate(self, state, latents, cond):
        """-> (final latents, uint8 pixels)."""
        return self.programs.evaluate(state, self.setup.frozen, self.setup.vae_state(), latents,
                                      cond, self._uncond(latents.shape[0]))

    def _uncond(self, n: int):
        if float(self.config.policy.diffusers.sample.guidance_scale) <= 1.0:
            return None
        return self.encode([""] * n, negative=True)

    def dispatch_update(self, state, rollout: dict, adv: np.ndarray, key, step: int):
        """Dispatch the algorithm's update -> (new state, pending metrics on the device, their
        host copy started); nothing waits for the device here."""
        data = {name: rollout[name] for name in self.algo.train_fields}
        data["cond"] = rollout["cond"]
        data.update({k: rollout[k] for k in ("prompt_cond", "cond_index") if k in rollout})
        data["advantage"] = self.setup.global_batch(np.asarray(adv, np.float32))
        eta = self.algo.post_update_decay(step)
        state, metrics = self.programs.update(state, self.setup.frozen, data, key,
                                              jnp.float32(eta), self.shared)
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


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, sharding):
    return jax.lax.with_sharding_constraint(jax.random.normal(key, shape, jnp.float32), sharding)


def build(config) -> RLRun:
    try:
        algo_cls = algorithm_named(config.train.train_policy.type)
    except AlgorithmConfigError as e:
        raise train_setup.SetupError(str(e)) from None
    try:
        algo_config = algo_cls.Config.from_recipe(config)
    except AlgorithmConfigError as e:  # a recipe value the algorithm cannot take
        raise ConfigError(str(e)) from None
    # the model first: without it nothing else matters (a missing model dir was once reported
    # as a missing reward service), then the data, then the rewards
    train_setup.check_video_flag(config)
    train_setup.ensure_tiny_assets(config)
    train_setup.check_model_dir(config)
    train_records, val_records = algo_cls.records(algo_config, config)
    # before the setup: the LR schedule and config.json take the resolved length
    what = "data items" if train_records and hasattr(train_records[0], "media_path") else "prompts"
    resolve_max_steps(config, len(train_records), what)
    rewards = RewardComputer.from_config(reward_config(config))
    rewards.check_reachable(budget_s=10.0)  # fail fast, before any model is loaded or compiled
    setup = train_setup.build(config, aux_fn=algo_cls.aux_fn(algo_config,
                                                             bool(config.policy.lora.enable)))
    algo = algo_cls(algo_config, setup.pipe.shell())
    programs = build_programs(setup, algo)
    batcher = group_batcher_from_config(config, train_records,
                                        data_parallel=batch_shards(setup))
    if setup.data_state:
        batcher.restore(setup.data_state)
    logger = MetricsLogger(config.train.output_dir, total_steps=config.train.max_steps,
                           wandb_cfg=config.train.wandb.to_dict(), start_step=setup.start_step)
    run = RLRun(config, setup, algo, rewards, batcher, val_records, logger, programs.layout,
                int(config.train.max_steps), int(config.train.train_batch_per_replica),
                int(config.train.seed), config.train.output_dir,
                base_key=jax.random.key(config.train.seed), programs=programs)
    max_len, dataset = config.policy.diffusers.max_prompt_length, config.train.train_policy.dataset
    if dataset.layout == "mock":  # random text embeddings per item (wfm_jax.data.mock)
        from wfm_jax.data.mock import MockTextEncoder
        run.text_encoder = MockTextEncoder(setup.pipe, max_len, dataset.mock_text_dim,
                                           int(config.train.seed), setup.batch_sharding())
    else:
        run.text_encoder = TextEncoder(setup.pipe, max_len, out_sharding=setup.batch_sharding())
    run.shared = algo.prepare(run)
    return run
