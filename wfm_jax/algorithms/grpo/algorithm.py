"""Flow-GRPO and its Fast (windowed) variant for the shared RL loop (spec algorithms.md §2).

Rollout: the current policy samples with the SDE (or CPS / Dance) sampler and CFG, one
`lax.scan` recording the trajectory; only the trained steps are stored, batch-first: the states
`traj` (B, K+1, ...) around the K trained steps, their flow sigmas (B, K+1), and the sampler's
log-probs (B, K) (a diagnostic: see below). Trained steps: the first int(N * timesteps_fraction)
steps in order, or, with `sde_window_size` > 0 (Flow-GRPO-Fast), the stochastic window, whose
start is drawn per rollout chunk in `sde_window_range`; outside the window the sampler is Euler.

Update: each trained step is recomputed with the training numerics (CFG with the unconditional
branch detached unless train_policy.cfg_detach_uncond is False); PPO-clipped ratio + closed-form
KL to the reference; gradients averaged over the trained steps and the micro-batches (one
optimizer step per inner epoch, or per chunk of train_policy.batch_size_per_optimize rows).

Exact ratio 1 at the first inner epoch, by construction: there the "old" log-prob IS the
log-prob just computed in the same forward (under stop_gradient), i.e. the policy that rolled
out evaluated with the training computation; later epochs reuse those stored values. With
several chunks per epoch the old values come from one pass with the pre-update weights before
the first update, so only the first chunk sees ratio 1 (later ones see weights already moved). The
sampler's own log-prob differs from it by XLA rounding only (~1e-7) and is reported as
`rollout_log_prob_gap`.

video2world (max_num_conditional_frames > 0): the rollout's cond holds the item's video
condition (algorithms.media.ItemMedia) and is stored with the trajectory, so every recomputed step sees
the same conditional latents, mask and conditional_frame_timestep; the conditioned frames'
velocity is exact (it does not depend on the weights), so their log-prob terms cancel in the
ratio; with CFG the negative branch gets the same frames (full_uncond).

Samples whose advantage is 0 (including groups dropped for a failed reward) stay in the
fixed-shape batch: their policy term is exactly 0, but they still count in the batch mean and
the KL term. flow_grpo drops them before batching; `filter_zero_advantage` = True comes close
without a new shape: both means run over the micro-batch's non-zero rows only (a micro-batch
with none contributes a zero gradient to the accumulated mean).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.base import (
    AlgorithmConfig,
    RLAlgorithm,
    RolloutContext,
    Velocity,
    as_velocity,
)
from wfm_jax.algorithms.grpo.loss import grpo_loss
from wfm_jax.sampling import steps as S
from wfm_jax.sampling.guidance import cfg_combine, uses_cfg
from wfm_jax.sampling.samplers import draw_window_start, sample
from wfm_jax.sampling.schedule import flow_schedule_of

F32 = jnp.float32
SOLVERS = {"flow": "sde", "sde": "sde", "cps": "cps", "dance": "dance"}


@dataclasses.dataclass(frozen=True)
class GRPOConfig(AlgorithmConfig):
    """Flow-GRPO (cosmos-rl's / flow_grpo's defaults): SDE rollouts of num_steps (or CPS /
    Dance) at noise_level with CFG guidance_scale; the first int(num_steps *
    timesteps_fraction) steps trained, or a window of window_size steps starting in
    window_range (Flow-GRPO-Fast); PPO clip_range."""
    solver: str = "sde"
    num_steps: int = 10
    timesteps_fraction: float = 0.99
    noise_level: float = 0.7
    guidance_scale: float = 1.0
    window_size: int = 0
    window_range: tuple[int, int] = (0, 10)
    clip_range: float = 1e-4
    cfg_detach_uncond: bool = True
    filter_zero_advantage: bool = False

    @classmethod
    def from_recipe(cls, config) -> GRPOConfig:
        s, tp = config.policy.diffusers.sample, config.train.train_policy
        return cls(**cls.common(config), solver=str(s.solver), num_steps=int(s.num_steps),
                   timesteps_fraction=float(tp.timesteps_fraction),
                   noise_level=float(s.noise_level), guidance_scale=float(s.guidance_scale),
                   window_size=int(s.sde_window_size),
                   window_range=(int(s.sde_window_range[0]), int(s.sde_window_range[1])),
                   clip_range=float(tp.clip_range), cfg_detach_uncond=bool(tp.cfg_detach_uncond),
                   filter_zero_advantage=bool(tp.filter_zero_advantage))


def step_transition(method: str, x, v, sigma, sigma_next, x_next, noise_level, sigma_for_one):
    """(mean, log_prob (B,), kl_std) of the stored step x -> x_next under velocity v.

    kl_std is what the closed-form KL divides by: std_dev_t for "sde" (no dt, as the reference
    code), the step's std for "cps" / "dance". sigma, sigma_next: scalars or (B,).
    """
    if method == "sde":
        lp, mean, std_dev_t = S.sde_log_prob(x_next, x, v, sigma, sigma_next, noise_level,
                                             sigma_for_one)
        return mean, lp, std_dev_t
    if method == "cps":
        mean, std = S.cps_mean(x, v, sigma, sigma_next, noise_level)
        return mean, S.cps_log_prob(x_next, mean), std
    if method == "dance":
        mean, std = S.dance_mean(x, v, sigma, sigma_next, noise_level)
        return mean, S.dance_log_prob(x_next, mean, std), S.per_sample(std, x)
    raise ValueError(f"Flow-GRPO has no transition for sampler {method!r}")


def guide_of(velocity: Velocity):
    """The model family's CFG form the velocity carries (programs.rl.make_velocity), or None."""
    return as_velocity(velocity).guide


def full_uncond(cond, uncond):
    """The unconditional branch's dict: the negative text of `uncond` and every other entry of
    `cond` (video2world frames), as diffusers' Cosmos pipeline conditions both branches on the
    video. Text-only conds have the same keys as `uncond`: it comes back unchanged."""
    if uncond is None or not isinstance(cond, dict):
        return uncond
    return {**cond, **uncond}


def cfg_velocity(velocity: Velocity, params, x, timesteps, cond, uncond, guidance: float,
                 detach_uncond: bool = True):
    """v_u + g (v_c - v_u) for training. detach_uncond: the unconditional branch is a separate
    forward under stop_gradient, so no backward pass runs through it (flow_grpo until mid 2025);
    False back-propagates through it too (flow_grpo's later code). timesteps: (B,) float32."""
    if not uses_cfg(uncond, guidance):
        return velocity(params, x, timesteps, cond).astype(F32)
    v_c = velocity(params, x, timesteps, cond).astype(F32)
    uncond = jax.tree.map(lambda u: jnp.broadcast_to(u, (x.shape[0],) + u.shape[1:]),
                          full_uncond(cond, uncond))
    v_u = velocity(params, x, timesteps, uncond).astype(F32)
    if detach_uncond:
        v_u = jax.lax.stop_gradient(v_u)
    return (guide_of(velocity) or cfg_combine)(v_c, v_u, guidance)


def flow_velocity(velocity: Velocity, params, x, sigma, cond, uncond, guidance: float,
                  detach_uncond: bool = True):
    """The guided velocity at flow sigma (B,): the network sees timestep 1000 sigma in fp32, as
    in the sampler."""
    timesteps = jnp.asarray(sigma, F32) * jnp.asarray(1000.0, F32)
    return cfg_velocity(velocity, params, x, timesteps, cond, uncond, guidance, detach_uncond)


class GRPO(RLAlgorithm[GRPOConfig]):
    """Flow-GRPO on the shared loop: on-policy SDE rollouts with stored trajectories; the update
    keeps per-step "old" log-probs across inner epochs (`keeps_old`)."""

    name: ClassVar[str] = "grpo"
    Config: ClassVar[type[GRPOConfig]] = GRPOConfig
    train_fields = ("traj", "sigmas", "log_prob")
    keeps_old: ClassVar[bool] = True

    def __init__(self, config: GRPOConfig, schedule):
        """schedule: the model family (its flow_schedule) or a bare flow shift."""
        super().__init__(config, schedule)
        c = config
        self.method = SOLVERS[c.solver]  # config.checks.check_rl_samplers vets solver / window
        self.num_steps = int(c.num_steps)
        self.sigmas = jnp.asarray(flow_schedule_of(schedule, self.num_steps, self.method)[0])
        self.window = int(c.window_size) or None
        if self.window is not None:
            self.window_range = tuple(int(v) for v in c.window_range)
            self.num_train = self.window
        else:
            self.num_train = max(1, int(self.num_steps * c.timesteps_fraction))
        self.noise_level = float(c.noise_level)
        self.guidance = float(c.guidance_scale)
        self.clip_range = float(c.clip_range)
        self.kl_beta = float(c.kl_beta)
        self.adv_clip = float(c.advantage_high)
        self.adv_low = float(c.advantage_low)
        self.detach_uncond = bool(c.cfg_detach_uncond)
        self.filter_zero = bool(c.filter_zero_advantage)

    def prepare(self, ctx: RolloutContext) -> dict:
        """Once per run: the arrays every rollout and update gets, here the negative-prompt ("")
        embedding for CFG (one rollout chunk / micro-batch of rows); the video encoder."""
        super().prepare(ctx)
        if self.guidance <= 1.0:
            return {}
        return {"uncond": ctx.encode([""] * ctx.rollout_chunk, negative=True)}

    # -- rollout --
    def rollout(self, velocity: Velocity, state, latents, cond, key, uncond=None,
                **inputs) -> dict:
        k_window, k_sde = jax.random.split(key)
        start = (draw_window_start(k_window, self.window_range, self.window)
                 if self.window is not None else jnp.int32(0))
        out = sample(lambda x, t, c: velocity(state.params, x, t, c), latents, self.sigmas, k_sde,
                     method=self.method, cond=cond, uncond=full_uncond(cond, uncond),
                     cfg_scale=self.guidance,
                     guide=guide_of(velocity), noise_level=self.noise_level,
                     sde_window_start=start if self.window is not None else None,
                     sde_window_size=self.window, return_trajectory=True)
        assert out.trajectory is not None and out.log_probs is not None  # return_trajectory
        k, b = self.num_train, latents.shape[0]
        traj = jax.lax.dynamic_slice_in_dim(out.trajectory, start, k + 1, axis=0)
        sig = jax.lax.dynamic_slice_in_dim(self.sigmas, start, k + 1)
        lp = jax.lax.dynamic_slice_in_dim(out.log_probs, start, k, axis=0)
        return {"traj": jnp.swapaxes(traj, 0, 1), "sigmas": jnp.broadcast_to(sig, (b, k + 1)),
                "log_prob": lp.T, "final": out.latents}

    def final_latents(self, fields: dict):
        return fields["final"]

    # -- update --
    def step_loss(self, velocity: Velocity, params, ref_params, batch: dict, j, old_log_prob,
                  uncond=None):
        """(loss, (metrics, log_prob)) of trained step j of a micro-batch; old_log_prob None
        means "this forward is the old policy" (first inner epoch): ratio exactly 1."""
        traj, sig = batch["traj"], batch["sigmas"]
        x, x_next, s, sn = traj[:, j], traj[:, j + 1], sig[:, j], sig[:, j + 1]
        v = flow_velocity(velocity, params, x, s, batch["cond"], uncond, self.guidance,
                          self.detach_uncond)
        mean, lp, kl_std = step_transition(self.method, x, v, s, sn, x_next, self.noise_level,
                                           self.sigmas[1])
        old = lp if old_log_prob is None else old_log_prob  # stop_gradient'ed in the loss
        ref_mean = None
        if self.kl_beta:
            v_ref = flow_velocity(velocity, ref_params, x, s, batch["cond"], uncond, self.guidance)
            ref_mean = step_transition(self.method, x, v_ref, s, sn, x_next, self.noise_level,
                                       self.sigmas[1])[0]
            # a deterministic step (CPS into sigma' = 0) has no Gaussian: its KL term is 0
            random = kl_std > 0
            ref_mean = jnp.where(random, ref_mean, jax.lax.stop_gradient(mean))
            kl_std = jnp.where(random, kl_std, 1.0)
        weight = (batch["advantage"] != 0).astype(F32) if self.filter_zero else None
        loss, metrics = grpo_loss(lp, old, batch["advantage"], clip_range=self.clip_range,
                                  adv_clip_max=self.adv_clip, adv_clip_min=self.adv_low,
                                  kl_beta=self.kl_beta, mean=mean, ref_mean=ref_mean,
                                  std_dev_t=kl_std, weight=weight)
        ratio = jnp.exp(lp - jax.lax.stop_gradient(old))
        metrics = dict(metrics, ratio_abs_dev=jax.lax.stop_gradient(jnp.max(jnp.abs(ratio - 1))),
                       rollout_log_prob_gap=jax.lax.stop_gradient(
                           jnp.max(jnp.abs(lp - batch["log_prob"][:, j]))))
        return loss, (metrics, jax.lax.stop_gradient(lp))

    def grads(self, velocity: Velocity, state, ref_params, batch: dict, key, *, old=None,
              first: bool = True, uncond=None, **shared):
        """Mean gradient / metrics over the trained steps of one micro-batch, and the (B, K)
        old log-probs (computed here on the first inner epoch, passed through after)."""
        del key
        grad_fn = jax.value_and_grad(self.step_loss, argnums=1, has_aux=True)

        def body(acc, j):
            old_j = None if first else old[:, j]
            (_, (metrics, lp)), g = grad_fn(velocity, state.params, ref_params, batch, j, old_j,
                                            uncond)
            return jax.tree.map(jnp.add, acc, (g, metrics)), lp

        shapes = jax.eval_shape(lambda: self.step_loss(velocity, state.params, ref_params, batch,
                                                       0, None, uncond)[1][0])
        zeros = (jax.tree.map(jnp.zeros_like, state.params),
                 jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))
        (grads, metrics), lps = jax.lax.scan(body, zeros, jnp.arange(self.num_train))
        scale = 1.0 / self.num_train
        grads = jax.tree.map(lambda g: g * scale, grads)
        metrics = jax.tree.map(lambda m: m * scale, metrics)
        return grads, metrics, (lps.T if first else old)
