"""cosmos-rl's world-model RL step as an algorithm on the shared RL loop: registered as
"wfm_rl"; cosmos-rl's Cosmos-Predict2.5 "GRPO" and DDRL recipes both run it (spec
cosmos_rl_wfm.md §1: one `rl_training_step`, the recipes differ only in [model.rl] values).

Rollout (on-policy, current weights): sampling.edm with the recipe's grid (sigma_max 200 ->
sigma_min 0.01, rho 7), churn on every step (eta = min(s_churn / (N + 1), sqrt(1.2) - 1)), the
x0-form solver (2ab), one clean denoise at sigma_min. The initial unit noise is shared by a
group's members under use_same_seed (one draw per (run seed, step, group): the same on every
process and chunk); the churn noise never is. Stored per trained step k (train_on; -1 = a
random untrained step, drawn per rollout chunk): the churned state x_hat_k, its sigma_hat,
sigma_{k+1}, the step's mean mu_old (the rollout's own float32 step, so the ratio is 1 up to
rounding: spec §10 fixes cosmos's float64 rollout), the next churned state x_hat_{k+1} (the
final clean sample at the last step), the 2ab history (previous x0 and sigma_hat), and the
initial noise (the data term's epsilon).

Update, per trained step (algorithms.wfm_rl.rl_step_loss): mu_theta from x_hat_k under the
trained net; log-ratio map, clipped policy loss; reverse-KL surrogate to the reference net's
mean at the same state when kl_beta > 0 (the reference equals the rollout-time one: it moves
only in post_update); the EDM-weighted data loss on the group's clip when data_beta > 0;
x loss_scale / len(train_on), gradients summed over the trained steps, one optimizer step per
loop step. Advantages: per group (num_rollout = rollout.n_generation members) over the unbiased
std + 1e-4, optional -exp(-A), clamped once by the loop to [advantage_low, advantage_high].
The reference copies the policy after every update_ref_every_iter-th optimizer step (cosmos:
at iterations 0, N, 2N, ... before the step; iteration 0's copy is the starting weights).

The data term's condition carries cosmos's text dropout (text_dropout_rate, DDRL 0.2: per row
and trained step, the text embeddings x 0; the video condition is kept).

Not reproduced (said by the recipe import): failed rewards drop their group (cosmos replaces
them by the group mean).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.algorithms import wfm_rl as W
from wfm_jax.algorithms.advantages import ddrl_advantages
from wfm_jax.algorithms.base import (
    AlgorithmConfig,
    AlgorithmConfigError,
    RLAlgorithm,
    RolloutContext,
    Velocity,
)
from wfm_jax.algorithms.grpo.algorithm import full_uncond
from wfm_jax.sampling import edm

F32 = jnp.float32
# the video condition's entries (families' video_condition / conditional_inputs): text dropout
# leaves them as they are
VIDEO_CONDITION_KEYS = frozenset({"cond_latents", "cond_mask", "cond_velocity"})
TEXT_DROPOUT_STREAM = 0x7D  # folded into the step's key: the data sigma draws stay as they were
TIMESTEP_SCALE = 1000.0  # the families' velocity takes 1000 x the flow sigma t = sigma / (1 + sigma)
_STEP_FIELDS = ("noise_x", "sigma", "sigma_next", "mu_old", "sample", "x0_prev", "sigma_prev",
                "first")


@dataclasses.dataclass(frozen=True)
class WFMRLAlgorithmConfig(AlgorithmConfig):
    """The step's settings (algorithms.wfm_rl.WFMRLConfig: cosmos-rl's keys and defaults) plus
    what every algorithm reads (kl_beta = step.kl_beta, the media of video2world)."""
    kl_beta: float = W.WFMRLConfig.kl_beta  # = step.kl_beta (the loop keeps a reference by it)
    step: W.WFMRLConfig = dataclasses.field(default_factory=W.WFMRLConfig)

    @classmethod
    def from_recipe(cls, config) -> WFMRLAlgorithmConfig:
        """train.train_policy.wfm (cosmos-rl's names), the group size rollout.n_generation, the
        conditional frames of policy.diffusers, the clamp advantage_low / advantage_high; a
        value the step cannot take is one line naming the key."""
        w, tp, d = config.train.train_policy.wfm, config.train.train_policy, config.policy.diffusers
        if not bool(w.on_policy):
            raise AlgorithmConfigError("config key 'train.train_policy.wfm.on_policy' = False: the "
                                       "world-model RL step rolls out with the current weights only")
        keys = ("sample_steps", "kl_beta", "data_beta", "clip_ratio", "update_ref_every_iter",
                "use_same_seed", "guidance", "solver_option", "s_churn", "s_noise", "s_t_min",
                "s_t_max", "on_policy", "exp_reward", "use_rl_sigma_and_noise",
                "data_on_first_only", "loss_scale", "sigma_min", "sigma_max", "p_mean", "p_std",
                "text_dropout_rate")
        try:
            step = W.WFMRLConfig(
                **{k: w[k] for k in keys}, train_on=tuple(int(i) for i in w.train_on),
                num_rollout=int(config.rollout.n_generation),
                min_num_conditional_frames=int(d.min_num_conditional_frames),
                max_num_conditional_frames=int(d.max_num_conditional_frames),
                adv_clip_min=float(tp.advantage_low), adv_clip_max=float(tp.advantage_high))
            intervals = step.plan().num_intervals
        except ValueError as e:
            raise AlgorithmConfigError(f"config keys 'train.train_policy.wfm.*': {e}") from None
        if any(i >= intervals for i in step.train_on) or len(step.train_on) > intervals:
            raise AlgorithmConfigError(
                f"config key 'train.train_policy.wfm.train_on' = {step.train_on}: the "
                f"{step.solver_option!r} rollout of sample_steps={step.sample_steps} has "
                f"{intervals} steps")
        common = cls.common(config)
        common["kl_beta"] = float(step.kl_beta)
        return cls(**common, step=step)


class WFMRL(RLAlgorithm[WFMRLAlgorithmConfig]):
    """cosmos-rl's world-model RL step (spec cosmos_rl_wfm.md §1) on the shared loop."""

    name: ClassVar[str] = "wfm_rl"
    Config: ClassVar[type[WFMRLAlgorithmConfig]] = WFMRLAlgorithmConfig

    def __init__(self, config: WFMRLAlgorithmConfig, schedule=None):
        """schedule: unused (the EDM grid of the step's sigma keys, not a flow schedule)."""
        super().__init__(config, schedule)
        self.step = config.step
        self.plan = self.step.plan()
        self.num_train = len(self.step.train_on)
        self.noise_seed_base = int(config.media.seed)
        fields: tuple[str, ...] = _STEP_FIELDS + ("index",)
        if self.step.data_beta:
            fields += ("noise", "data_x0")
        self.train_fields = fields
        self.reads_data = bool(self.step.data_beta) or self.media.conditions

    # -- loop hooks --
    @classmethod
    def moves_reference(cls, config: WFMRLAlgorithmConfig) -> bool:
        return int(config.step.update_ref_every_iter) > 0

    @classmethod
    def records(cls, config: WFMRLAlgorithmConfig, recipe) -> tuple[list, list]:
        """Data items with media when the step reads them (video2world or the data term),
        else prompt files."""
        from wfm_jax.data.prompts import prompt_splits_from_config
        from wfm_jax.data.records import media_records
        if config.media.cond_frames[1] > 0 or config.step.data_beta > 0:
            return media_records(recipe)
        return prompt_splits_from_config(recipe)

    def prepare(self, ctx: RolloutContext) -> dict:
        """Once per run: the VAE encoder when the step reads data; the unconditional text when
        guidance > 0."""
        if self.reads_data:
            self.media.prepare(ctx)
        return ({"uncond": ctx.encode([""] * ctx.rollout_chunk, negative=True)}
                if self.step.guidance else {})

    def group_seeds(self, step: int, groups) -> np.ndarray:
        """(rows,) int32 noise seed of each row's group, fixed by (run seed, step, group): every
        member of a group, on any process or chunk, starts from the same noise."""
        return np.asarray([np.random.default_rng((self.noise_seed_base, step, int(g), 3))
                           .integers(0, 2**31 - 1) for g in np.asarray(groups).tolist()], np.int32)

    def chunk_inputs(self, ctx: RolloutContext, batch: dict, lo: int, hi: int) -> dict:
        """The group noise seeds (use_same_seed), the clip latents of the data term and the
        video2world condition (algorithms.media.ItemMedia)."""
        out = {}
        if self.step.use_same_seed:
            out["noise_seed"] = ctx.place(self.group_seeds(int(batch["step"]), batch["group"][lo:hi]))
        if self.reads_data:
            out.update(self.media.inputs(ctx, batch, lo, hi, keep_latents=bool(self.step.data_beta)))
        return out

    def abstract_chunk_inputs(self, ctx: RolloutContext, latents) -> dict:
        out = super().abstract_chunk_inputs(ctx, latents)
        if self.step.use_same_seed:
            out["noise_seed"] = jax.ShapeDtypeStruct((latents.shape[0],), jnp.int32,
                                                     sharding=latents.sharding)
        if self.step.data_beta:
            out["data_x0"] = latents
        return out

    def advantages(self, rewards, groups, *, global_std: bool = True, ddof: int = 0):
        """Per group over the unbiased std + 1e-4 (exp_reward: -exp(-A)); the loop clamps."""
        return ddrl_advantages(rewards, groups, exp_reward=self.step.exp_reward, clip_min=None,
                               clip_max=None)

    # -- the model as a denoiser --
    def denoiser(self, velocity: Velocity, params, cond, uncond=None) -> edm.Denoiser:
        """x0(x, sigma) of the RF network under cosmos's RectifiedFlowScaling, with cosmos's
        guidance x0 = c + g (c - u) when guidance > 0 (gradient through both branches)."""
        def net(c):
            return lambda x_in, t: velocity(params, x_in, t, c).astype(F32)
        cond_fn = edm.rf_denoiser(net(cond), TIMESTEP_SCALE)
        if not self.step.guidance:
            return cond_fn
        # the negative text is one row repeated (encoded once per run): as many rows as cond
        rows = jax.tree.leaves(cond)[0].shape[0]
        uncond = full_uncond(cond, {k: jnp.broadcast_to(u[:1], (rows,) + u.shape[1:])
                                    for k, u in uncond.items()})
        return edm.cosmos_guided(cond_fn, edm.rf_denoiser(net(uncond), TIMESTEP_SCALE),
                                 self.step.guidance)

    def initial_noise(self, latents, noise_seed=None):
        """The rollout's unit noise: the loop's independent draw, or one per group seed."""
        if noise_seed is None:
            return jnp.asarray(latents, F32)
        base = jax.random.key(self.noise_seed_base)
        return jax.vmap(lambda s: jax.random.normal(jax.random.fold_in(base, s), latents.shape[1:],
                                                    F32))(noise_seed)

    # -- rollout --
    def rollout(self, velocity: Velocity, state, latents, cond, key, uncond=None, data_x0=None,
                noise_seed=None, **inputs) -> dict:
        k_steps, k_churn = jax.random.split(key)
        noise = self.initial_noise(latents, noise_seed)
        traj = edm.sample(self.denoiser(velocity, state.params, cond, uncond), noise, self.plan,
                          k_churn)
        steps = W.draw_train_on(k_steps, self.step.train_on, self.plan.num_intervals)
        picked = jax.vmap(lambda k: edm.trajectory_step(traj, k))(steps)  # (K, B, ...) / (K,)
        b = latents.shape[0]
        fields: dict[str, Any] = {}
        for name in _STEP_FIELDS + ("index",):
            a = getattr(picked, name)
            fields[name] = (jnp.swapaxes(a, 0, 1) if a.ndim > 1
                            else jnp.broadcast_to(a, (b,) + a.shape))
        fields.update(noise=noise, final=traj.final)
        if data_x0 is not None:
            fields["data_x0"] = data_x0
        return fields

    def final_latents(self, fields: dict):
        return fields["final"]

    # -- update --
    @staticmethod
    def step_at(batch: dict, j) -> edm.TrajectoryStep:
        """Trained step j of every row (per-row sigmas (B,))."""
        take = {name: batch[name][:, j] for name in _STEP_FIELDS + ("index",)}
        # this step's x0 prediction is recomputed by the trained net, not read
        return edm.TrajectoryStep(x0_pred=take["mu_old"], **take)

    def step_loss(self, velocity: Velocity, params, ref_params, batch: dict, j, uncond=None):
        """(loss, metrics) of trained step j: algorithms.wfm_rl.rl_step_loss with the reference
        mean (kl_beta > 0) at the same state and history."""
        step = self.step_at(batch, j)
        cond = batch["cond"]
        mu_ref = None
        if self.step.kl_beta:
            ref_fn = self.denoiser(velocity, ref_params, cond, uncond)
            mu_ref = jax.lax.stop_gradient(edm.step_mean(
                ref_fn, step.noise_x, step.sigma, step.sigma_next, solver=self.step.solver_option,
                x0_prev=step.x0_prev, sigma_prev=step.sigma_prev, first=step.first)[0])
        data = {}
        if self.step.data_beta:
            # the data term denoises with the condition alone (no CFG), as cosmos's data loss,
            # through the conditioner at its default rates: the text dropout applies here only
            data_cond = W.drop_text(
                cond, jax.random.fold_in(jax.random.fold_in(batch["key"], j), TEXT_DROPOUT_STREAM),
                self.step.text_dropout_rate, VIDEO_CONDITION_KEYS)
            data = dict(data_x0=batch["data_x0"],
                        data_x0_fn=self.denoiser(velocity, params, data_cond), noise=batch["noise"])
            if not self.step.use_rl_sigma_and_noise:
                k_sigma, k_eps = jax.random.split(jax.random.fold_in(batch["key"], j))
                x0 = batch["data_x0"]
                video = x0.ndim == 5
                data.update(data_sigma=W.draw_data_sigma(k_sigma, x0.shape[0], self.step, video=video),
                            data_eps=jax.random.normal(k_eps, x0.shape, F32))
        loss, metrics = W.rl_step_loss(self.denoiser(velocity, params, cond, uncond), step,
                                       batch["advantage"], self.step, micro_step=j, mu_ref=mu_ref,
                                       **data)
        return loss, metrics

    def grads(self, velocity: Velocity, state, ref_params, batch: dict, key, *, old=None,
              first: bool = True, uncond=None, **shared):
        """Gradient of the loop step's loss summed over the trained steps (each step's loss is
        already / len(train_on)); metrics: the summed loss, the other terms' means."""
        batch = dict(batch, key=key)
        grad_fn = jax.value_and_grad(self.step_loss, argnums=1, has_aux=True)

        def body(acc, j):
            (_, metrics), g = grad_fn(velocity, state.params, ref_params, batch, j, uncond)
            return jax.tree.map(jnp.add, acc, (g, metrics)), None

        shapes = jax.eval_shape(lambda: self.step_loss(velocity, state.params, ref_params, batch,
                                                       0, uncond)[1])
        zeros = (jax.tree.map(jnp.zeros_like, state.params),
                 jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))
        (grads, metrics), _ = jax.lax.scan(body, zeros, jnp.arange(self.num_train))
        metrics = {k: (v if k == "loss" else v / self.num_train) for k, v in metrics.items()}
        return grads, metrics

    # -- after the update --
    def post_update_decay(self, step: int) -> float:
        """1.0 when the reference copies the policy after loop step `step`, else 0.0."""
        n = int(self.step.update_ref_every_iter)
        return 1.0 if n > 0 and step % n == 0 else 0.0

    def post_update(self, state, eta):
        if "ref" not in state.aux:
            return state
        ref = jax.tree.map(lambda r, p: jnp.where(eta > 0, p, r), state.aux["ref"], state.params)
        return state.replace(aux=dict(state.aux, ref=ref))
