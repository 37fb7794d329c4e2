"""DDRL (data-regularised RL, cosmos-rl's wfm trainer) for the shared RL loop (spec §4).

Data: the prompts are the captions of a paired dataset (X.json + X.png, train.train_policy.dataset;
or WebDataset shards in the paired layout, local or s3://, indexed once: data/webdataset.py);
each global batch holds groups of `n_generation` rollouts of one data item, and, when
data_beta > 0, that item's image is VAE-encoded to the clean latent of the data loss.
video2world (max_num_conditional_frames > 0): each item's first n latent frames condition all
of its rollouts (algorithms.media.ItemMedia, shared with NFT and Flow-GRPO); with CFG the negative
branch is conditioned on the same frames (grpo.algorithm.full_uncond), as in diffusers' pipeline.

Rollout (on-policy, current weights): the EDM sampler with churn and the 2ab multistep update
(method "edm", sigma_max * eps start). Stored per trained step k (`train_on`, -1 entries
replaced by random other steps, drawn per rollout chunk as the reference draws per data batch):
the churned state x_hat_k the network saw, the next churned state x_{k+1}, the previous step's
x0 prediction and churned sigma (the 2ab history, constants in training), the sigmas, and the
initial unit noise (the data loss's epsilon under use_rl_sigma_and_noise).

Update per trained step: mu_theta = deterministic step from x_hat_k with the trained network;
log-ratio -mean[(x' - mu_theta)^2 - (x' - mu_old)^2] (over the step's transition std under
log_ratio_norm "std", not cosmos-rl's); PPO clip; optional reverse-KL surrogate to
the reference; data loss on the real latent; x loss_scale; mean over the trained steps.
mu_old is, as in Flow-GRPO here, the first inner epoch's own mu_theta under stop_gradient, so
the ratio is exactly 1 there (the reference stores the sampler's mean; equal up to rounding);
with batch_size_per_optimize chunks, a pre-update pass gives every row its mu_old instead.
The reference's last trained step (k = N-1) would compare against its final clean sample; here
x_{N} is the last step's output. Advantages: ddrl_advantages (per-group unbiased std,
exp_reward; the loop clips them once).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.advantages import ddrl_advantages
from wfm_jax.algorithms.base import (
    AlgorithmConfig,
    AlgorithmConfigError,
    RLAlgorithm,
    RolloutContext,
    Velocity,
)
from wfm_jax.algorithms.ddrl.loss import (
    LOG_RATIO_NORMS,
    ddrl_data_loss,
    ddrl_loss,
    draw_data_sigma,
    edm_noisy,
)
from wfm_jax.algorithms.grpo.algorithm import cfg_velocity, full_uncond, guide_of
from wfm_jax.sampling import steps as S
from wfm_jax.sampling.samplers import sample
from wfm_jax.sampling.schedule import edm_churn_eta, edm_sigmas

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class DDRLConfig(AlgorithmConfig):
    """DDRL (cosmos-rl's wfm trainer defaults): EDM rollouts of num_steps on the
    (sigma_min, sigma_max, rho) grid with churn; the trained steps train_on (-1: a random other
    step); PPO clip_range; the data loss weight data_beta at the rollout's sigma and noise (or
    a lognormal sigma); the reference copied every update_ref_every_iter steps."""
    num_steps: int = 10
    edm_sigma_min: float = 0.01
    edm_sigma_max: float = 200.0
    edm_rho: float = 7.0
    s_churn: float = 1.0
    s_noise: float = 1.0
    s_tmin: float = 0.0
    s_tmax: float = 1e9
    train_on: tuple[int, ...] = tuple(range(0, 20, 2))
    guidance_scale: float = 1.0
    clip_range: float = 1e-4
    data_beta: float = 0.01
    loss_scale: float = 10.0
    use_rl_sigma_and_noise: bool = True
    data_on_first_only: bool = False
    exp_reward: bool = False
    data_sigma_p_mean: float = 1.3862943611198906  # log 4
    data_sigma_p_std: float = 1.2
    update_ref_every_iter: int = 16
    log_ratio_norm: str = "none"

    @classmethod
    def from_recipe(cls, config) -> DDRLConfig:
        """The recipe's DDRL keys; train_on checked against num_steps here (one line naming
        the key, before any model is loaded)."""
        s, tp = config.policy.diffusers.sample, config.train.train_policy
        resolve_train_on(tp.train_on, int(s.num_steps))
        return cls(**cls.common(config), num_steps=int(s.num_steps),
                   edm_sigma_min=float(s.edm_sigma_min), edm_sigma_max=float(s.edm_sigma_max),
                   edm_rho=float(s.edm_rho), s_churn=float(s.s_churn), s_noise=float(s.s_noise),
                   s_tmin=float(s.s_tmin), s_tmax=float(s.s_tmax),
                   train_on=tuple(int(i) for i in tp.train_on),
                   guidance_scale=float(s.guidance_scale), clip_range=float(tp.clip_range),
                   data_beta=float(tp.data_beta), loss_scale=float(tp.loss_scale),
                   use_rl_sigma_and_noise=bool(tp.use_rl_sigma_and_noise),
                   data_on_first_only=bool(tp.data_on_first_only),
                   exp_reward=bool(tp.exp_reward),
                   data_sigma_p_mean=float(tp.data_sigma_p_mean),
                   data_sigma_p_std=float(tp.data_sigma_p_std),
                   update_ref_every_iter=int(tp.update_ref_every_iter),
                   log_ratio_norm=str(tp.log_ratio_norm))


def resolve_train_on(train_on, num_steps: int) -> tuple[list[int], list[int], int]:
    """(explicit steps, candidates for the -1 entries, number of -1 entries), checked."""
    entries = [int(i) for i in train_on]
    explicit = sorted(i for i in entries if i != -1)
    bad = [i for i in explicit if not 0 <= i < num_steps]
    if not entries or bad or len(set(explicit)) != len(explicit):
        raise AlgorithmConfigError(f"config key 'train.train_policy.train_on' = {tuple(entries)} must list "
                                  f"distinct step indices in [0, {num_steps}) (sample.num_steps) or -1")
    candidates = [i for i in range(num_steps) if i not in explicit]
    n_random = len(entries) - len(explicit)
    if n_random > len(candidates):
        raise AlgorithmConfigError(f"config key 'train.train_policy.train_on' asks for {n_random} random "
                          f"steps but only {len(candidates)} steps are left")
    return explicit, candidates, n_random


def edm_x0(velocity: Velocity, params, x, sigma, cond, uncond=None, guidance: float = 1.0):
    """Clean prediction of the RF network at EDM state x (sigma (B,)), as the sampler computes
    it: input (1 - t) x, timestep 1000 t, t = sigma / (1 + sigma); uncond branch detached."""
    x_in, t = S.edm_model_input(x, sigma)
    timesteps = jnp.broadcast_to(t * jnp.asarray(1000.0, F32), (x.shape[0],))
    return S.edm_x0(x, cfg_velocity(velocity, params, x_in, timesteps, cond, uncond, guidance),
                    sigma)


def step_mean(x_hat, sigma_hat, sigma_next, x0, x0_prev, sigma_prev_hat, first):
    """Per-row deterministic EDM step (steps.edm_step_mean with each row's own sigmas)."""
    def one(x, sh, sn, x0_, x0p, sph, f):
        return S.edm_step_mean(x[None], sh, sn, x0_[None], x0p[None], sph, f)[0]
    return jax.vmap(one)(x_hat, sigma_hat, sigma_next, x0, x0_prev, sigma_prev_hat, first)


class DDRL(RLAlgorithm[DDRLConfig]):
    """DDRL on the shared loop (on-policy EDM rollouts, policy + KL + data loss)."""

    name: ClassVar[str] = "ddrl"
    Config: ClassVar[type[DDRLConfig]] = DDRLConfig
    keeps_old: ClassVar[bool] = True
    _STEP_FIELDS = ("x_hat", "x_next", "x0_prev", "sigma_hat", "sigma_next", "sigma_prev_hat",
                    "step")

    def __init__(self, config: DDRLConfig, schedule=None):
        """schedule: unused (the EDM grid of the edm_sigma_* keys, not a flow schedule)."""
        super().__init__(config, schedule)
        c = config
        self.num_steps = int(c.num_steps)
        self.sigmas = jnp.asarray(edm_sigmas(self.num_steps, c.edm_sigma_min, c.edm_sigma_max,
                                             c.edm_rho), F32)
        self.sigma_max = float(c.edm_sigma_max)
        self.churn: dict[str, Any] = dict(s_churn=float(c.s_churn), s_noise=float(c.s_noise),
                          s_tmin=float(c.s_tmin), s_tmax=float(c.s_tmax))
        self.eta = edm_churn_eta(float(c.s_churn), self.num_steps)
        self.explicit, self.candidates, self.n_random = resolve_train_on(c.train_on,
                                                                         self.num_steps)
        self.num_train = len(self.explicit) + self.n_random
        self.guidance = float(c.guidance_scale)
        self.clip_range = float(c.clip_range)
        self.kl_beta = float(c.kl_beta)
        self.data_beta = float(c.data_beta)
        self.loss_scale = float(c.loss_scale)
        self.rl_sigma_and_noise = bool(c.use_rl_sigma_and_noise)
        self.data_on_first_only = bool(c.data_on_first_only)
        self.exp_reward = bool(c.exp_reward)
        self.data_sigma = (float(c.data_sigma_p_mean), float(c.data_sigma_p_std))
        self.update_ref_every = int(c.update_ref_every_iter)
        if c.log_ratio_norm not in LOG_RATIO_NORMS:
            raise AlgorithmConfigError(f"config key 'train.train_policy.log_ratio_norm' = "
                                       f"{c.log_ratio_norm!r} is not one of {list(LOG_RATIO_NORMS)}")
        self.norm_by_std = c.log_ratio_norm == "std"
        self.train_fields = (self._STEP_FIELDS + (("std",) if self.norm_by_std else ())
                             + (("noise", "data_x0") if self.data_beta else ()))
        # the data latents and, for video2world, the first n latent frames of each item's clip
        self.reads_data = bool(self.data_beta) or self.media.conditions

    # -- loop hooks --
    @classmethod
    def moves_reference(cls, config: DDRLConfig) -> bool:
        """The KL reference follows the policy (update_ref_every_iter > 0): keep it in the state
        even under LoRA."""
        return int(config.update_ref_every_iter) > 0

    @classmethod
    def records(cls, config: DDRLConfig, recipe) -> tuple[list, list]:
        """(train, validation) records of the dataset (data.records.media_records)."""
        from wfm_jax.data.records import media_records
        return media_records(recipe)

    def prepare(self, ctx: RolloutContext) -> dict:
        """Once per run: the VAE encoder for the data latents; the CFG negative embedding."""
        if self.reads_data:
            self.media.prepare(ctx)
        return ({"uncond": ctx.encode([""] * ctx.rollout_chunk, negative=True)}
                if self.guidance > 1 else {})

    def chunk_inputs(self, ctx: RolloutContext, batch: dict, lo: int, hi: int) -> dict:
        """The clean latents of the chunk's data items (same VAE draw for a whole group) and,
        for video2world, the conditioning on their first frames (algorithms.media.ItemMedia)."""
        if not self.reads_data:
            return {}
        return self.media.inputs(ctx, batch, lo, hi, keep_latents=bool(self.data_beta))

    def abstract_chunk_inputs(self, ctx: RolloutContext, latents) -> dict:
        out = super().abstract_chunk_inputs(ctx, latents)
        if self.data_beta:  # the data term's clean latents, shaped like the rollout's
            out["data_x0"] = latents
        return out

    def advantages(self, rewards, groups, *, global_std: bool = True, ddof: int = 0):
        # unclipped: the loop clips every algorithm's advantages once to [advantage_low, _high]
        return ddrl_advantages(rewards, groups, exp_reward=self.exp_reward, clip_min=None,
                               clip_max=None)

    # -- rollout --
    def draw_steps(self, key) -> jax.Array:
        """(K,) ascending trained step indices: the explicit ones plus random other steps."""
        steps = jnp.asarray(self.explicit, jnp.int32)
        if self.n_random:
            pick = jax.random.permutation(key, jnp.asarray(self.candidates, jnp.int32))
            steps = jnp.concatenate([steps, pick[:self.n_random]])
        return jnp.sort(steps)

    def rollout(self, velocity: Velocity, state, latents, cond, key, uncond=None,
                data_x0=None, **inputs) -> dict:
        k_steps, k_sde = jax.random.split(key)
        out = sample(lambda x, t, c: velocity(state.params, x, t, c), latents * self.sigma_max,
                     self.sigmas, k_sde, method="edm", cond=cond, uncond=full_uncond(cond, uncond),
                     cfg_scale=self.guidance, guide=guide_of(velocity), return_trajectory=True,
                     **self.churn)
        assert out.trajectory is not None and out.x0 is not None  # return_trajectory, "edm"
        assert out.sigmas_hat is not None
        steps = self.draw_steps(k_steps)
        prev = jnp.maximum(steps - 1, 0)
        b = latents.shape[0]

        def per_row(a, idx):  # (N, B, ...) -> (B, K, ...)
            return jnp.swapaxes(jnp.take(a, idx, axis=0), 0, 1)

        def shared(a):  # (K,) -> (B, K)
            return jnp.broadcast_to(a, (b,) + a.shape)

        fields = {"x_hat": per_row(out.trajectory, steps),
                  "x_next": per_row(out.trajectory, steps + 1),
                  "x0_prev": per_row(out.x0, prev),
                  "sigma_hat": shared(out.sigmas_hat[steps]),
                  "sigma_next": shared(self.sigmas[steps + 1]),
                  "sigma_prev_hat": shared(out.sigmas_hat[prev]),
                  "step": shared(steps), "noise": latents, "final": out.latents}
        if self.norm_by_std:  # the Gaussian from step k's mean to x_{k+1} (0 after the last)
            assert out.stds is not None
            fields["std"] = shared(out.stds[steps])
        if data_x0 is not None:
            fields["data_x0"] = data_x0
        return fields

    def final_latents(self, fields: dict):
        return fields["final"]

    # -- update --
    def mean_at(self, velocity: Velocity, params, batch: dict, j, uncond=None):
        """mu of trained step j of every row under `params`."""
        x_hat, sh = batch["x_hat"][:, j], batch["sigma_hat"][:, j]
        x0 = edm_x0(velocity, params, x_hat, sh, batch["cond"], uncond, self.guidance)
        return step_mean(x_hat, sh, batch["sigma_next"][:, j], x0, batch["x0_prev"][:, j],
                         batch["sigma_prev_hat"][:, j], batch["step"][:, j] == 0)

    def data_loss_at(self, velocity: Velocity, params, batch: dict, j, key):
        """EDM-form diffusion loss on the real latents at the rollout's sigma_hat and noise
        (use_rl_sigma_and_noise) or at a lognormal sigma with fresh noise."""
        x0 = batch["data_x0"]
        if self.rl_sigma_and_noise:
            sigma, eps = batch["sigma_hat"][:, j], batch["noise"]
        else:
            k_sigma, k_eps = jax.random.split(jax.random.fold_in(key, j))
            sigma = draw_data_sigma(k_sigma, x0.shape[0], *self.data_sigma)
            eps = jax.random.normal(k_eps, x0.shape, F32)
        pred = edm_x0(velocity, params, edm_noisy(x0, eps, sigma), sigma, batch["cond"])
        return ddrl_data_loss(x0, pred, sigma)

    def step_loss(self, velocity: Velocity, params, ref_params, batch: dict, j, mean_old, key,
                  uncond=None):
        """(loss, (metrics, mu_theta)) of trained step j; mean_old None = first inner epoch."""
        mean = self.mean_at(velocity, params, batch, j, uncond)
        old = jax.lax.stop_gradient(mean) if mean_old is None else mean_old
        mean_ref = (self.mean_at(velocity, ref_params, batch, j, uncond) if self.kl_beta
                    else None)
        data = None
        if self.data_beta:
            def data_fn():
                return self.data_loss_at(velocity, params, batch, j, key)
            data = (jax.lax.cond(j == 0, data_fn, lambda: jnp.zeros((), F32))
                    if self.data_on_first_only else data_fn())
        x_next = batch["x_next"][:, j]
        std = batch["std"][:, j] if self.norm_by_std else None
        loss, metrics = ddrl_loss(x_next, mean, old, batch["advantage"],
                                  clip_ratio=self.clip_range, kl_beta=self.kl_beta,
                                  mean_ref=mean_ref, data_beta=self.data_beta, data_loss=data,
                                  loss_scale=self.loss_scale, std=std)
        return loss, (metrics, jax.lax.stop_gradient(mean))

    def grads(self, velocity: Velocity, state, ref_params, batch: dict, key, *, old=None,
              first: bool = True, uncond=None, **shared):
        """Mean gradient / metrics over the trained steps of one micro-batch, and the
        (B, K, ...) old means (computed on the first inner epoch, passed through after)."""
        ref = ref_params  # the loop passes state.aux["ref"] when the reference is kept there
        grad_fn = jax.value_and_grad(self.step_loss, argnums=1, has_aux=True)

        def body(acc, j):
            old_j = None if first else old[:, j]
            (_, (metrics, mean)), g = grad_fn(velocity, state.params, ref, batch, j, old_j, key,
                                              uncond)
            return jax.tree.map(jnp.add, acc, (g, metrics)), mean

        shapes = jax.eval_shape(lambda: self.step_loss(velocity, state.params, ref, batch, 0,
                                                       None, key, uncond)[1][0])
        zeros = (jax.tree.map(jnp.zeros_like, state.params),
                 jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))
        (grads, metrics), means = jax.lax.scan(body, zeros, jnp.arange(self.num_train))
        scale = 1.0 / self.num_train
        grads = jax.tree.map(lambda g: g * scale, grads)
        metrics = jax.tree.map(lambda m: m * scale, metrics)
        return grads, metrics, (jnp.swapaxes(means, 0, 1) if first else old)

    # -- after the update --
    def post_update_decay(self, step: int) -> float:
        """1.0 when the reference is due to copy the policy after this step, else 0.0."""
        n = self.update_ref_every
        return 1.0 if n > 0 and step % n == 0 else 0.0

    def post_update(self, state, eta):
        if "ref" not in state.aux:
            return state
        ref = jax.tree.map(lambda r, p: jnp.where(eta > 0, p, r), state.aux["ref"], state.params)
        return state.replace(aux=dict(state.aux, ref=ref))
