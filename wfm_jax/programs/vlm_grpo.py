"""The GRPO update of the vision-language model (Qwen3-VL / Cosmos-Reason2), as cosmos-rl's GRPO
trainer for language models computes it (specs/reason2.md §4.2), on full prompt + completion rows:

    logp[b, t] = log_softmax(logits[b, t] / temperature)[ids[b, t + 1]]   (algorithms/lm_grpo.py)
    loss       = lm_grpo.accumulated_grpo_loss(logp, old, ref, advantages, mask, cfg)

`mask` [B, L-1] marks the positions whose next token is a completion token (the rollout's tokens
and its end token; never prompt, visual or padding tokens): `completion_mask` [B, L] marks those
tokens in `input_ids`. The rows come in their groups' order, every row a real one (variant "dapo"
fills the step with valid groups), so the mini-batches of `cfg.mini_batch` rows are cosmos-rl's.
The loss is one rank's (dp_size 1) over the whole batch: the gradient cosmos-rl accumulates into
one optimizer step over these rows.

Old log-probs: `use_old` False (the first mu-iteration's first update) takes the policy's own,
detached (ratio exactly 1); True `batch["old_logp"]`, computed before the first update by
`VLMLogprobs`. The reference's (`batch["ref_logp"]`, kl_beta > 0) come from the same program on
the reference parameters. use_old is a traced flag (one program for both); as the SFT step, each
distinct image-grid set is its own program.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from wfm_jax.algorithms import lm_grpo
from wfm_jax.core.mesh import mesh_jit
from wfm_jax.programs.state import TrainState, train_state_update
from wfm_jax.programs.vlm_sft import batch_shardings, grid_key

MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "pixel_values", "pixel_values_videos")
BATCH_KEYS = (*MODEL_KEYS, "completion_mask", "advantages", "old_logp", "ref_logp")


def grpo_config(config) -> lm_grpo.LMGRPOConfig:
    """The recipe's LMGRPOConfig (train.train_policy.lm_grpo, rollout.n_generation and the
    update's batching keys); a bad value is a ValueError naming the block."""
    g, tp = config.train.train_policy.lm_grpo, config.train.train_policy
    try:
        return lm_grpo.LMGRPOConfig(
            n_generation=int(config.rollout.n_generation), temperature=float(g.temperature),
            sampling_temperature=None if g.sampling_temperature is None else float(g.sampling_temperature),
            top_p=float(g.top_p), top_k=int(g.top_k), max_response_length=int(g.max_response_length),
            epsilon_low=float(g.epsilon_low), epsilon_high=float(g.epsilon_high),
            lower_bound_ratio=float(g.lower_bound_ratio), kl_beta=float(g.kl_beta),
            unbiased_kl_estimate=bool(g.unbiased_kl_estimate), loss_type=str(g.loss_type),
            unbiased_loss_max_tokens=g.unbiased_loss_max_tokens, unbiased_advantage=bool(g.unbiased_advantage),
            mu_iterations=int(tp.mu_iterations), mini_batch=int(tp.mini_batch),
            batch_size_per_optimize=tp.batch_size_per_optimize,
            min_filter_prefix_tokens=g.min_filter_prefix_tokens, variant=str(g.variant),
            max_retry_for_on_policy=int(g.max_retry_for_on_policy))
    except ValueError as e:
        raise ValueError(f"train.train_policy.lm_grpo: {e}") from None


@dataclasses.dataclass(frozen=True)
class GRPORows:
    """How a VLM GRPO step's rows divide (train/vlm_grpo.py runs them, plan/vlm.py plans them):
    step = train_batch_per_replica (groups x n_generation), per_call = one generate call's rows
    (rollout.batch_size prompts x n_generation), per_update = one optimizer update's
    (batch_size_per_optimize), micro = one of its train.grad_accum_steps micro-batches."""
    step: int
    groups: int
    per_call: int
    per_update: int
    micro: int


def grpo_rows(config, cfg: lm_grpo.LMGRPOConfig) -> GRPORows:
    """The recipe's GRPORows; a split the trainer cannot make is a ValueError naming the key."""
    step = int(config.train.train_batch_per_replica)
    groups = step // cfg.n_generation
    per_update = int(cfg.batch_size_per_optimize or step)
    if per_update % cfg.n_generation:
        raise ValueError(f"train.train_policy.batch_size_per_optimize={per_update} must hold whole "
                         f"groups of rollout.n_generation={cfg.n_generation}")
    accum = int(config.train.grad_accum_steps)
    if per_update % accum or (per_update // accum) % cfg.mini_batch:
        raise ValueError(f"train.grad_accum_steps={accum} must split the {per_update} rows of one "
                         f"optimizer update into micro-batches of whole mini-batches "
                         f"(train.train_policy.mini_batch={cfg.mini_batch})")
    # more than the step has (a recipe sized for more replicas): one call holds them all
    prompts_per_call = min(int(config.rollout.batch_size or groups), groups)
    if prompts_per_call < 1 or groups % prompts_per_call:
        raise ValueError(f"rollout.batch_size={config.rollout.batch_size} must divide the {groups} "
                         f"prompts of a step (train_batch_per_replica / rollout.n_generation)")
    return GRPORows(step, groups, prompts_per_call * cfg.n_generation, per_update, per_update // accum)


def sequence_logprobs(model, batch: Mapping[str, jax.Array], image_grid: tuple | None = None,
                      video_grid: tuple | None = None, temperature: float = 1.0) -> jax.Array:
    """[B, L-1] float32: each next token's log-prob under `model` (prompt, media and all)."""
    out = model(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                batch.get("pixel_values"), None if image_grid is None else np.asarray(image_grid),
                batch.get("pixel_values_videos"), None if video_grid is None else np.asarray(video_grid))
    return lm_grpo.next_token_logprobs(out["logits"], batch["input_ids"], temperature)


def grpo_loss(model, batch: Mapping[str, jax.Array], cfg: lm_grpo.LMGRPOConfig, image_grid: tuple | None = None,
              video_grid: tuple | None = None, use_old=False) -> tuple[jax.Array, dict]:
    """(loss, aux) of one update batch; aux: policy_loss, kl_loss, clip_fraction, tokens.
    use_old (a bool, or a traced scalar): old log-probs from batch["old_logp"], else the policy's own."""
    logp = sequence_logprobs(model, batch, image_grid, video_grid, cfg.temperature)
    mask = lm_grpo.completion_logprob_mask(batch["completion_mask"])
    if isinstance(use_old, bool):
        old = batch["old_logp"] if use_old else None
    else:  # one program for both: where() is exact, and ratio is exactly 1 where it picks logp
        old = jnp.where(use_old, batch["old_logp"], jax.lax.stop_gradient(logp))
    ref = batch.get("ref_logp") if cfg.kl_beta != 0.0 else None
    loss, aux = lm_grpo.accumulated_grpo_loss(logp, old, ref, batch["advantages"], mask, cfg)
    return loss, {**aux, "tokens": jnp.sum(mask)}


def micro_scales(real_rows: Sequence[int]) -> list[float]:
    """The loss weight of each of the k micro-batches of one optimizer update, k * n_c / n (n_c
    its rows with a completion token, n the update's): the k gradients optax.MultiSteps averages
    then sum to the gradient of the whole update's accumulated_grpo_loss, which weights each
    mini-batch by its rows over the update's rows (micro-batches hold whole mini-batches)."""
    total = sum(real_rows)
    if total <= 0:
        raise ValueError("an update without rows to train on has no micro-batch weights")
    return [len(real_rows) * n / total for n in real_rows]


def place(batch: Mapping[str, Any], mesh, rules=None) -> dict[str, jax.Array]:
    """The update batch's arrays as global arrays split over the mesh (rows on data x fsdp)."""
    arrays = {k: np.asarray(batch[k]) for k in BATCH_KEYS if batch.get(k) is not None}
    shardings = batch_shardings(arrays, mesh, rules)
    return {k: jax.device_put(v, shardings[k]) for k, v in arrays.items()}


class VLMLogprobs:
    """logprobs(params, frozen, batch, image_grid=None, video_grid=None) -> [B, L-1] float32 (no
    gradient): the old policy's or the reference's log-probs of an update batch."""

    def __init__(self, graphdef, mesh, temperature: float = 1.0, rules=None):
        self.graphdef, self.mesh, self.temperature, self.rules = graphdef, mesh, temperature, rules
        self._programs: dict = {}

    def program(self, image_grid=None, video_grid=None):
        key = (grid_key(image_grid), grid_key(video_grid))
        if key not in self._programs:
            graphdef, temperature = self.graphdef, self.temperature

            def logprobs(params, frozen, batch):
                return sequence_logprobs(nnx.merge(graphdef, params, frozen), batch, *key, temperature)

            self._programs[key] = mesh_jit(logprobs, mesh=self.mesh, rules=self.rules)
        return self._programs[key]

    def __call__(self, params, frozen, batch, image_grid=None, video_grid=None):
        return self.program(image_grid, video_grid)(params, frozen, batch)


class VLMGRPOStep:
    """step(state, frozen, batch, use_old, image_grid=None, video_grid=None, scale=1.0) -> (state,
    {"loss", "policy_loss", "kl_loss", "clip_fraction", "tokens", "grad_norm"}): one optimizer
    update, or with train.grad_accum_steps k one of its k micro-steps (optax.MultiSteps averages
    their gradients). use_old False: the policy's own log-probs as the old ones (ratio 1;
    batch["old_logp"] may be absent). scale multiplies the loss and its aux values (a traced
    scalar): a micro-batch's share of the update's loss. One compiled program per grid set and
    batch shape; the state is donated."""

    def __init__(self, graphdef, tx: optax.GradientTransformation, mesh, cfg: lm_grpo.LMGRPOConfig, rules=None):
        self.graphdef, self.tx, self.mesh, self.cfg, self.rules = graphdef, tx, mesh, cfg, rules
        self._programs: dict = {}

    def _build(self, image_grid, video_grid):
        graphdef, tx, cfg = self.graphdef, self.tx, self.cfg

        def step(state: TrainState, frozen, batch, use_old, scale):
            def loss_fn(params):
                loss, aux = grpo_loss(nnx.merge(graphdef, params, frozen), batch, cfg, image_grid, video_grid,
                                      use_old)
                return scale * loss, {k: v if k == "tokens" else scale * v for k, v in aux.items()}

            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
            state, info = train_state_update(state, grads, tx)
            return state, {"loss": loss, **aux, "grad_norm": info["grad_norm"]}

        return mesh_jit(step, mesh=self.mesh, rules=self.rules, donate_argnums=0)

    def program(self, image_grid=None, video_grid=None):
        key = (grid_key(image_grid), grid_key(video_grid))
        if key not in self._programs:
            self._programs[key] = self._build(*key)
        return self._programs[key]

    def __call__(self, state, frozen, batch, use_old: bool, image_grid=None, video_grid=None,
                 scale: float = 1.0):
        program = self.program(image_grid, video_grid)
        if "old_logp" not in batch:  # same program either way: zeros stand in, never read
            batch = {**batch, "old_logp": jnp.zeros(batch["input_ids"].shape[:1] + (batch["input_ids"].shape[1] - 1,),
                                                    jnp.float32)}
        return program(state, frozen, batch, jnp.asarray(bool(use_old)), jnp.asarray(scale, jnp.float32))
