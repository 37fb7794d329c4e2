"""DiffusionNFT's rollout and update, as functions of a velocity function (spec algorithms.md §3).

`velocity(params, x, timesteps, cond) -> v` closes over the frozen model; `params` is the
trainable tree (LoRA or full), so the same function serves the current policy, the "old" policy
(a second copy of the trainable tree) and the reference (LoRA zeroed, or the initial weights).

video2world (max_num_conditional_frames > 0): rollouts condition on the first latent frames of
each item's clip (algorithms.media.ItemMedia); the stored cond carries them to the loss. There the
velocity is exact, so the rollout ends on the condition's latents and x0's prediction equals x0:
those frames add zero error, and the adaptive (mean err^2 / mean |err|) weight makes the loss
that of the free frames alone.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.base import AlgorithmConfig, RLAlgorithm, Velocity
from wfm_jax.algorithms.decay import old_policy_decay, soft_update
from wfm_jax.algorithms.nft.loss import nft_loss, train_timesteps, trained_step_count
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import flow_schedule_of

F32 = jnp.float32
# the recipe's NFT solver names: cosmos-rl's "flow", "ddim" and "dpm1" are the Euler step here
_SOLVER_ALIASES = {"flow": "euler", "ddim": "euler", "dpm1": "euler"}


@dataclasses.dataclass(frozen=True)
class NFTConfig(AlgorithmConfig):
    """DiffusionNFT (cosmos-rl's defaults): a deterministic rollout of num_steps with `solver`,
    int(num_steps * timesteps_fraction) trained timesteps, the implicit-policy strength
    nft_beta, the old policy's decay schedule (algorithms.decay)."""
    solver: str = "dpm2"
    num_steps: int = 10
    timesteps_fraction: float = 0.99
    nft_beta: float = 1.0
    decay_type: int = 1

    @classmethod
    def from_recipe(cls, config) -> NFTConfig:
        d, tp = config.policy.diffusers, config.train.train_policy
        return cls(**cls.common(config), solver=str(d.sample.solver),
                   num_steps=int(d.sample.num_steps),
                   timesteps_fraction=float(tp.timesteps_fraction), nft_beta=float(d.nft_beta),
                   decay_type=int(d.weight_copy_decay_type))


def nft_rollout(velocity: Velocity, old_params, latents, cond, sigmas, *, solver: str = "dpm2",
                timesteps=None):
    """CFG-free deterministic rollout with the old policy; only the clean latents are kept.
    timesteps: what the model sees per step (None: 1000 sigma; UniPC: diffusers' truncated)."""
    out = sample(lambda x, t, c: velocity(old_params, x, t, c), latents, sigmas, method=solver,
                 cond=cond, timesteps=timesteps)
    return out.latents


def nft_grads(velocity: Velocity, params, old_params, ref_params, x0, cond, advantages, key, *,
              sigmas, num_train: int, beta: float, kl_weight: float, adv_clip_max: float,
              adv_clip_min: float | None = None):
    """Mean gradient and metrics of the NFT loss over K trained timesteps of each sample.

    Each timestep draws fresh noise; x_t = (1 - t) x0 + t eps with t the flow sigma, and the
    network sees timestep 1000 t in float32 at rollout and training alike.
    """
    b = x0.shape[0]
    k_t, k_eps = jax.random.split(key)
    ts = train_timesteps(k_t, jnp.asarray(sigmas)[:-1], b, num_train)  # (B, K) flow sigmas
    noises = jax.random.normal(k_eps, (num_train,) + x0.shape, F32)

    def loss_at(p, t, eps):
        tt = t.reshape((b,) + (1,) * (x0.ndim - 1))
        x_t = (1.0 - tt) * x0 + tt * eps
        timesteps = t * 1000.0
        v_theta = velocity(p, x_t, timesteps, cond)
        v_old = velocity(old_params, x_t, timesteps, cond)
        v_ref = velocity(ref_params, x_t, timesteps, cond) if kl_weight > 0 else None
        return nft_loss(v_theta, v_old, x0, x_t, t, advantages, v_ref, beta=beta,
                        adv_clip_max=adv_clip_max, adv_clip_min=adv_clip_min, kl_weight=kl_weight)

    grad_fn = jax.value_and_grad(loss_at, has_aux=True)

    def body(acc, j):
        (_, metrics), grads = grad_fn(params, ts[:, j], noises[j])
        return jax.tree.map(jnp.add, acc, (grads, metrics)), None

    zero_grads = jax.tree.map(jnp.zeros_like, params)
    zero_metrics = jax.eval_shape(lambda: loss_at(params, ts[:, 0], noises[0])[1])
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_metrics)
    (grads, metrics), _ = jax.lax.scan(body, (zero_grads, zero_metrics), jnp.arange(num_train))
    scale = 1.0 / num_train
    return jax.tree.map(lambda g: g * scale, grads), jax.tree.map(lambda m: m * scale, metrics)


class NFT(RLAlgorithm[NFTConfig]):
    """DiffusionNFT for the shared RL loop: the "old" policy (state.aux["old"], same tree as the
    trained parameters) collects data CFG-free; the update trains on the stored clean latents;
    after each step the old policy moves toward the current one (decay schedule §3)."""

    name: ClassVar[str] = "nft"
    Config: ClassVar[type[NFTConfig]] = NFTConfig
    train_fields = ("x0",)

    def __init__(self, config: NFTConfig, schedule):
        """schedule: the model family (its flow_schedule) or a bare flow shift."""
        super().__init__(config, schedule)
        c = config
        self.solver = _SOLVER_ALIASES.get(c.solver, c.solver)
        self.sigmas = jnp.asarray(flow_schedule_of(schedule, c.num_steps)[0])
        # the rollout's grid: UniPC (Wan's sampler) and DPM-Solver++ (SANA's) step on their
        # scheduler's sigmas and feed the model diffusers' truncated timesteps; the training
        # timesteps stay the flow grid at 1000 sigma (what every family's velocity_with takes)
        self.rollout_sigmas, self.rollout_timesteps = self.sigmas, None
        if self.solver in ("unipc", "dpm_solver"):
            sigmas, timesteps = flow_schedule_of(schedule, c.num_steps, self.solver)
            self.rollout_sigmas = jnp.asarray(sigmas)
            self.rollout_timesteps = None if timesteps is None else jnp.asarray(timesteps)
        self.num_train = max(1, trained_step_count(c.num_steps, c.timesteps_fraction))
        self.beta = float(c.nft_beta)
        self.kl_weight = float(c.kl_beta)
        # cosmos-rl: r from A clamped to [advantage_low, advantage_high], divided by advantage_high
        self.adv_clip = float(c.advantage_high)
        self.adv_low = float(c.advantage_low)
        self.decay_type = int(c.decay_type)

    @classmethod
    def init_aux(cls, params) -> dict:
        return {"old": params}  # setup copies it

    def rollout(self, velocity: Velocity, state, latents, cond, key, **inputs) -> dict:
        return {"x0": nft_rollout(velocity, state.aux["old"], latents, cond, self.rollout_sigmas,
                                  solver=self.solver, timesteps=self.rollout_timesteps)}

    def final_latents(self, fields: dict):
        return fields["x0"]

    def grads(self, velocity: Velocity, state, ref_params, batch: dict, key, *, old=None,
              first: bool = True, **shared):
        return nft_grads(velocity, state.params, state.aux["old"], ref_params, batch["x0"],
                         batch["cond"], batch["advantage"], key, sigmas=self.sigmas,
                         num_train=self.num_train, beta=self.beta, kl_weight=self.kl_weight,
                         adv_clip_max=self.adv_clip, adv_clip_min=self.adv_low)

    def post_update_decay(self, step: int) -> float:
        return old_policy_decay(step, self.decay_type)

    def post_update(self, state, eta):
        return state.replace(aux=dict(state.aux, old=soft_update(state.aux["old"], state.params,
                                                                 eta)))
