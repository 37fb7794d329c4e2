"""DiffusionNFT's rollout and update, as functions of a velocity function (spec algorithms.md §3).

`velocity(params, x, timesteps, cond) -> v` closes over the frozen model; `params` is the
trainable tree (LoRA or full), so the same function serves the current policy, the "old" policy
(a second copy of the trainable tree) and the reference (LoRA zeroed, or the initial weights).

video2world (max_num_conditional_frames > 0): rollouts condition on the first latent frames of
each item's clip (rl_data.ItemMedia); the stored cond carries them to the loss. There the
velocity is exact, so the rollout ends on the condition's latents and x0's prediction equals x0:
those frames add zero error, and the adaptive (mean err^2 / mean |err|) weight makes the loss
that of the free frames alone.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.nft import nft_loss, train_timesteps, trained_step_count
from wfm_jax.sampling.samplers import sample
from wfm_jax.train.rl_data import ItemMedia, media_records, uses_video_condition

F32 = jnp.float32
Velocity = Callable[[Any, jax.Array, jax.Array, Any], jax.Array]


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


class NFT:
    """DiffusionNFT for the shared RL loop: the "old" policy (state.aux["old"], same tree as the
    trained parameters) collects data CFG-free; the update trains on the stored clean latents;
    after each step the old policy moves toward the current one (decay schedule §3)."""

    name = "nft"
    train_fields = ("x0",)

    def __init__(self, config, schedule):
        """schedule: the model family (its flow_schedule) or a bare flow shift."""
        from wfm_jax.sampling.schedule import flow_schedule_of
        d = config.policy.diffusers
        tp = config.train.train_policy
        # config_schema.NFT_SOLVERS: cosmos-rl's "flow", "ddim" and "dpm1" are the Euler step here
        self.solver = {"flow": "euler", "ddim": "euler", "dpm1": "euler"}.get(d.sample.solver,
                                                                             d.sample.solver)
        self.sigmas = jnp.asarray(flow_schedule_of(schedule, d.sample.num_steps)[0])
        # the rollout's grid: UniPC (Wan's sampler) and DPM-Solver++ (SANA's) step on their
        # scheduler's sigmas and feed the model diffusers' truncated timesteps; the training
        # timesteps stay the flow grid at 1000 sigma (what every family's velocity_with takes)
        self.rollout_sigmas, self.rollout_timesteps = self.sigmas, None
        if self.solver in ("unipc", "dpm_solver"):
            sigmas, timesteps = flow_schedule_of(schedule, d.sample.num_steps, self.solver)
            self.rollout_sigmas = jnp.asarray(sigmas)
            self.rollout_timesteps = None if timesteps is None else jnp.asarray(timesteps)
        self.num_train = max(1, trained_step_count(d.sample.num_steps, tp.timesteps_fraction))
        self.beta = float(d.nft_beta)
        self.kl_weight = float(tp.kl_beta)
        # cosmos-rl: r from A clamped to [advantage_low, advantage_high], divided by advantage_high
        self.adv_clip = float(tp.advantage_high)
        self.adv_low = float(tp.advantage_low)
        self.decay_type = int(d.weight_copy_decay_type)
        self.media = ItemMedia(config)  # video2world: rollouts on frames of the data's clips

    @staticmethod
    def init_aux(params) -> dict:
        return {"old": params}  # setup copies it

    # -- video2world (max_num_conditional_frames > 0): prompt + video items, as DDRL reads --
    @staticmethod
    def records(config) -> tuple[list, list]:
        if uses_video_condition(config):
            return media_records(config)
        from wfm_jax.data.prompts import prompt_splits_from_config
        return prompt_splits_from_config(config)

    def prepare(self, run) -> dict:
        if self.media.conditions:
            self.media.prepare(run)
        return {}

    def chunk_inputs(self, run, batch: dict, lo: int, hi: int) -> dict:
        """{"cond": the video condition of rows lo:hi} (joins the text's cond in the rollout and
        is stored with it, so the update's loss sees the same), or nothing for text2world."""
        if not self.media.conditions:
            return {}
        return self.media.inputs(run, batch, lo, hi, keep_latents=False)

    def rollout(self, velocity, state, latents, cond, key) -> dict:
        return {"x0": nft_rollout(velocity, state.aux["old"], latents, cond, self.rollout_sigmas,
                                  solver=self.solver, timesteps=self.rollout_timesteps)}

    def final_latents(self, fields: dict):
        return fields["x0"]

    def grads(self, velocity, state, ref_params, batch: dict, key):
        return nft_grads(velocity, state.params, state.aux["old"], ref_params, batch["x0"],
                         batch["cond"], batch["advantage"], key, sigmas=self.sigmas,
                         num_train=self.num_train, beta=self.beta, kl_weight=self.kl_weight,
                         adv_clip_max=self.adv_clip, adv_clip_min=self.adv_low)

    def post_update_decay(self, step: int) -> float:
        from wfm_jax.algorithms.decay import old_policy_decay
        return old_policy_decay(step, self.decay_type)

    def post_update(self, state, eta):
        from wfm_jax.programs.ema import soft_update
        return state.replace(aux=dict(state.aux, old=soft_update(state.aux["old"], state.params,
                                                                 eta)))
