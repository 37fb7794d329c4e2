"""cosmos-rl's world-model RL step (its "GRPO" and DDRL recipes share it) as pure array functions.

Spec: shared/specs/cosmos_rl_wfm.md §1 (cosmos-rl `WFMTrainer.rl_training_step`,
`_sync_rewards_across_rollouts`, `_sync_data_across_rollouts`). Per trained trajectory step k
with mu_theta the step mean under the trained net (sampling.edm.step_mean from x_hat_k):

  log-ratio map  -[(x' - mu_theta)^2 - (x' - mu_old)^2]   (x' = next churned state; no 1/2std^2)
  ratio          exp(mean over C, T, H, W of the map)                      (B,)
  L_pol          mean_B max(-A ratio, -A clip(ratio, 1 - clip_ratio, 1 + clip_ratio))
  L_KL           mean (mu_ref - mu_theta)^2     (mu_ref: reference net, computed at rollout)
  L_data         mean (1 + sigma^2)/sigma^2 (x0 - x0_hat)^2 at x_sigma = x0 + sigma eps
  L              (L_pol + kl_beta L_KL + data_beta L_data) loss_scale / (grad_accum_iter len(train_on))
Advantages: per reward model and group of num_rollout members, (r - mean) / (unbiased std + 1e-4),
invalid rewards replaced by the mean of the valid ones, averaged over models, optionally
-exp(-A), clamped to [adv_clip_min, adv_clip_max]; a group of one keeps A = r.

The functions take batches (B, ...) and return per-sample values where the reference has one
sample per rank, so a mean over rows equals cosmos's mean over ranks (equal-sized samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.sampling import edm

F32 = jnp.float32
_LOG_HIGH_SIGMA = (math.log(200.0), math.log(100000.0))  # cosmos LOGUNIFORM200_100000


@dataclass(frozen=True)
class WFMRLConfig:
    """The RL step's settings with cosmos-rl's defaults (commit 89f2e5b; keys of its TOML).

    The defaults are what the "GRPO" recipes run (they have no [model.rl] table); `ddrl()` gives
    the DDRL 2B/14B recipes' values.
    """

    sample_steps: int = 10                 # model.rl.sample_steps
    train_on: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)  # model.rl.train_on (-1 = random untrained step)
    num_rollout: int = 8                   # model.rl.num_rollout (group size)
    kl_beta: float = 0.01                  # model.rl.kl_beta
    data_beta: float = 0.0                 # model.rl.data_beta
    clip_ratio: float = 1e-4               # model.rl.clip_ratio
    update_ref_every_iter: int = 16        # model.rl.update_ref_every_iter (0 = never)
    use_same_seed: bool = True             # model.rl.use_same_seed (same initial noise per group)
    min_num_conditional_frames: int = 1    # model.rl.min_num_conditional_frames
    max_num_conditional_frames: int = 1    # model.rl.max_num_conditional_frames
    guidance: float = 0.0                  # model.rl.guidance (cosmos form c + g(c - u))
    solver_option: str = "2ab"             # model.rl.solver_option
    s_churn: float = 1.0                   # model.rl.s_churn
    s_noise: float = 1.0                   # model.rl.s_noise
    s_t_min: float = 0.0                   # model.rl.s_t_min
    s_t_max: float = math.inf              # model.rl.s_t_max
    on_policy: bool = True                 # model.rl.on_policy
    exp_reward: bool = False               # model.rl.exp_reward
    use_rl_sigma_and_noise: bool = True    # model.rl.use_rl_sigma_and_noise
    data_on_first_only: bool = False       # model.rl.data_on_first_only
    adv_clip_min: float = -5.0             # model.rl.reward_config.adv_clip_min
    adv_clip_max: float = 5.0              # model.rl.reward_config.adv_clip_max
    adv_eps: float = 1e-4                  # hard-coded in cosmos `_sync_rewards_across_rollouts`
    loss_scale: float = 10.0               # model.loss_scale
    grad_accum_iter: int = 1               # trainer.grad_accum_iter
    sigma_min: float = 0.01                # model.sde.sigma_min
    sigma_max: float = 200.0               # model.sde.sigma_max
    rho: float = 7.0                       # sampler `Sampler.forward` default rho
    sigma_data: float = 1.0                # model.sigma_data
    p_mean: float = math.log(4.0)          # model.sde.p_mean (data sigma, use_rl_sigma_and_noise off)
    p_std: float = 1.2                     # model.sde.p_std
    state_t: int = 24                      # model.state_t (data sigma x sqrt(state_t) for video)
    high_sigma_ratio: float = 0.05         # model.high_sigma_ratio (LOGUNIFORM200_100000)
    text_dropout_rate: float = 0.0         # [[model.conditioner]] text dropout_rate (data loss only)

    def __post_init__(self):
        object.__setattr__(self, "train_on", tuple(int(i) for i in self.train_on))
        problems = []
        if self.sample_steps < 1:
            problems.append(f"sample_steps={self.sample_steps} must be >= 1")
        if self.solver_option not in edm.SOLVER_ORDER:
            problems.append(f"solver_option={self.solver_option!r} must be one of {tuple(edm.SOLVER_ORDER)}")
        explicit = [i for i in self.train_on if i != -1]
        n_random = len(self.train_on) - len(explicit)
        if (not self.train_on or len(set(explicit)) != len(explicit)
                or any(not 0 <= i < self.sample_steps for i in explicit)
                or n_random > self.sample_steps - len(explicit)):
            problems.append(f"train_on={self.train_on} must list distinct steps in [0, {self.sample_steps}) "
                            "or -1, with enough untrained steps left for the -1 entries")
        if self.num_rollout < 1 or self.grad_accum_iter < 1:
            problems.append("num_rollout and grad_accum_iter must be >= 1")
        if self.kl_beta < 0 or self.data_beta < 0 or self.clip_ratio < 0 or self.loss_scale <= 0:
            problems.append("kl_beta, data_beta, clip_ratio must be >= 0 and loss_scale > 0")
        if not 0 <= self.min_num_conditional_frames <= self.max_num_conditional_frames:
            problems.append("need 0 <= min_num_conditional_frames <= max_num_conditional_frames")
        if self.adv_clip_min > self.adv_clip_max or self.adv_eps <= 0:
            problems.append("need adv_clip_min <= adv_clip_max and adv_eps > 0")
        if self.update_ref_every_iter < 0:
            problems.append("update_ref_every_iter must be >= 0")
        if not 0.0 <= self.text_dropout_rate <= 1.0:
            problems.append(f"text_dropout_rate={self.text_dropout_rate} must be in [0, 1]")
        if problems:
            raise ValueError("WFMRLConfig: " + "; ".join(problems))

    @classmethod
    def ddrl(cls, **overrides) -> WFMRLConfig:
        """The DDRL 2B/14B recipes' [model.rl] (cosmos-predict2-5-*-720-reason-embedding-ddrl.toml)."""
        values: dict[str, Any] = {"sample_steps": 20, "train_on": tuple(range(0, 20, 2)), "kl_beta": 0.0,
                  "data_beta": 0.01, "update_ref_every_iter": 0, "use_same_seed": False,
                  "min_num_conditional_frames": 0, "max_num_conditional_frames": 1}
        values.update(overrides)
        return cls(**values)

    @property
    def micro_steps(self) -> int:
        """Backward passes per optimizer step, cosmos's effective grad_accum_iter."""
        return self.grad_accum_iter * len(self.train_on)

    def plan(self) -> edm.EDMPlan:
        """The rollout sampler's grid and churn."""
        return edm.make_plan(self.sample_steps, solver=self.solver_option, sigma_min=self.sigma_min,
                             sigma_max=self.sigma_max, rho=self.rho, s_churn=self.s_churn,
                             s_noise=self.s_noise, s_t_min=self.s_t_min, s_t_max=self.s_t_max)


# ----------------------------------------------------------------------------- advantages


def group_advantages(rewards, group_size: int, *, valid=None, eps: float = 1e-4,
                     exp_reward: bool = False, clip_min: float | None = -5.0,
                     clip_max: float | None = 5.0):
    """(B,) float32 advantages; jit-safe. rewards (B,) or (M, B) for M reward models, groups of
    `group_size` adjacent rows; valid (B,) or (M, B) bool (None: all valid).

    Per model and group: invalid rewards become the mean of the group's valid ones (0 when none
    is valid), then A = (r - mean) / (std_unbiased + eps); group_size 1 keeps A = r (0 where
    invalid). Then the mean over models, exp_reward (A -> -exp(-A)), and the clamp.
    """
    r = jnp.asarray(rewards, F32)
    r = r[None] if r.ndim == 1 else r
    if r.ndim != 2:
        raise ValueError(f"rewards must be (B,) or (M, B), got shape {r.shape}")
    m, b = r.shape
    if group_size < 1 or b % group_size:
        raise ValueError(f"{b} rewards do not split into groups of {group_size}")
    ok = jnp.ones_like(r, bool) if valid is None else jnp.broadcast_to(jnp.asarray(valid, bool), r.shape)
    r = jnp.where(ok, r, 0.0)
    if group_size == 1:
        adv = r
    else:
        g = r.reshape(m, b // group_size, group_size)
        okg = ok.reshape(g.shape)
        n_ok = jnp.sum(okg, axis=-1, keepdims=True)
        valid_mean = jnp.where(n_ok > 0, jnp.sum(g, axis=-1, keepdims=True) / jnp.maximum(n_ok, 1), 0.0)
        g = jnp.where(okg, g, valid_mean)
        mean = jnp.mean(g, axis=-1, keepdims=True)
        std = jnp.std(g, axis=-1, keepdims=True, ddof=1)
        adv = ((g - mean) / (std + eps)).reshape(m, b)
    a = jnp.mean(adv, axis=0)
    if exp_reward:
        a = -jnp.exp(-a)
    if clip_min is not None or clip_max is not None:
        a = jnp.clip(a, clip_min, clip_max)
    return a


def advantages_for(rewards, config: WFMRLConfig, valid=None):
    """group_advantages with the config's group size, epsilon, exp_reward and clamp."""
    return group_advantages(rewards, config.num_rollout, valid=valid, eps=config.adv_eps,
                            exp_reward=config.exp_reward, clip_min=config.adv_clip_min,
                            clip_max=config.adv_clip_max)


# ----------------------------------------------------------------------------- loss terms


def _mean_rows(x):
    return jnp.mean(x, axis=tuple(range(1, x.ndim)))


def log_ratio_map(sample, mu_theta, mu_old):
    """-[(x' - mu_theta)^2 - (x' - mu_old)^2] elementwise, float32; mu_old is a constant."""
    x = jnp.asarray(sample, F32)
    old = jax.lax.stop_gradient(jnp.asarray(mu_old, F32))
    return -((x - jnp.asarray(mu_theta, F32)) ** 2 - (x - old) ** 2)


def policy_ratio(sample, mu_theta, mu_old):
    """(ratio (B,), log_ratio (B,)): exp of the per-sample mean of the log-ratio map."""
    log_ratio = _mean_rows(log_ratio_map(sample, mu_theta, mu_old))
    return jnp.exp(log_ratio), log_ratio


def policy_loss_per_sample(ratio, advantages, clip_ratio: float = 1e-4):
    """(B,) max(-A ratio, -A clip(ratio, 1 - c, 1 + c))."""
    a = jnp.asarray(advantages, F32)
    return jnp.maximum(-a * ratio, -a * jnp.clip(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio))


def kl_per_sample(mu_ref, mu_theta):
    """(B,) mean (mu_ref - mu_theta)^2 with mu_ref a constant (reverse-KL surrogate)."""
    ref = jax.lax.stop_gradient(jnp.asarray(mu_ref, F32))
    return _mean_rows((ref - jnp.asarray(mu_theta, F32)) ** 2)


def edm_weight(sigma, sigma_data: float = 1.0):
    """EDM per-sigma loss weight (sigma^2 + sigma_data^2) / (sigma sigma_data)^2."""
    s = jnp.asarray(sigma, F32)
    return (s**2 + sigma_data**2) / (s * sigma_data) ** 2


def _sigma_like(sigma, x):
    """sigma (B,) -> (B, 1, ...); (B, T) -> (B, 1, T, 1, 1) for video latents (B, C, T, H, W)."""
    s = jnp.asarray(sigma, F32)
    if s.ndim == 2:
        if x.ndim != 5 or s.shape != (x.shape[0], x.shape[2]):
            raise ValueError(f"per-frame sigma {s.shape} needs latents (B, C, T, H, W), got {x.shape}")
        return s[:, None, :, None, None]
    return s.reshape(s.shape + (1,) * (x.ndim - s.ndim))


def noisy_data(x0, eps, sigma):
    """EDM forward process x_sigma = x0 + sigma eps (sigma (B,) or per frame (B, T))."""
    return jnp.asarray(x0, F32) + _sigma_like(sigma, x0) * jnp.asarray(eps, F32)


def data_loss_per_sample(x0, x0_pred, sigma, *, sigma_data: float = 1.0, condition_mask=None):
    """(B,) mean of w(sigma) (x0 - x0_hat)^2. condition_mask (broadcastable to x0, 1 on
    conditioned latent frames): there x0_hat := x0, so those frames add 0 but stay in the mean's
    denominator, as cosmos's denoise_replace_gt_frames does."""
    x0 = jnp.asarray(x0, F32)
    pred = jnp.asarray(x0_pred, F32)
    if condition_mask is not None:
        pred = jnp.where(jnp.asarray(condition_mask) > 0, x0, pred)
    w = edm_weight(_sigma_like(sigma, x0), sigma_data)
    return _mean_rows(w * (x0 - pred) ** 2)


def draw_data_sigma(key, batch: int, config: WFMRLConfig, *, video: bool = True):
    """(B,) sigma of the data loss when use_rl_sigma_and_noise is off: exp(N(p_mean, p_std)),
    x sqrt(state_t) for video, then (video) a high_sigma_ratio share replaced by
    loguniform[200, 1e5] (cosmos v2v LOGUNIFORM200_100000). Keys: split(key, 3) = normal, mask
    uniform, loguniform uniform."""
    k_n, k_mask, k_hi = jax.random.split(key, 3)
    sigma = jnp.exp(config.p_mean + config.p_std * jax.random.normal(k_n, (batch,), F32))
    if not video:
        return sigma
    sigma = sigma * math.sqrt(config.state_t)
    lo, hi = _LOG_HIGH_SIGMA
    high = jnp.exp(jax.random.uniform(k_hi, (batch,), F32) * (hi - lo) + lo)
    return jnp.where(jax.random.uniform(k_mask, (batch,), F32) < config.high_sigma_ratio, high, sigma)


def drop_text(cond: dict, key, rate: float, keep: frozenset[str]) -> dict:
    """cosmos-rl's text conditioner dropout (spec §5): each row's text embeddings are multiplied
    by 0 with probability `rate` (one Bernoulli draw per row, shared by every text entry);
    entries named in `keep` (the video condition) pass unchanged."""
    if not rate:
        return cond
    rows = jax.tree.leaves(cond)[0].shape[0]
    kept = (jax.random.uniform(key, (rows,), F32) >= rate).astype(F32)
    return {k: v if k in keep else v * kept.reshape((rows,) + (1,) * (v.ndim - 1)).astype(v.dtype)
            for k, v in cond.items()}


# ----------------------------------------------------------------------------- combined loss


def per_sample_loss(sample, mu_theta, mu_old, advantages, config: WFMRLConfig, *, mu_ref=None,
                    data_loss=None):
    """(per-sample loss (B,), terms): (pol + kl_beta kl + data_beta data) loss_scale / micro_steps
    for each row. data_loss: (B,) data_loss_per_sample, or None when this micro-step has no data
    term (data_beta 0, or data_on_first_only past the first step). Its mean over rows is the
    micro-step's loss."""
    ratio, log_ratio = policy_ratio(sample, mu_theta, mu_old)
    pol = policy_loss_per_sample(ratio, advantages, config.clip_ratio)
    zeros = jnp.zeros_like(pol)
    if config.kl_beta > 0:
        if mu_ref is None:
            raise ValueError("kl_beta > 0 needs mu_ref, the reference net's step mean")
        kl = kl_per_sample(mu_ref, mu_theta)
    else:
        kl = zeros
    data = zeros if data_loss is None or config.data_beta == 0 else jnp.asarray(data_loss, F32)
    raw = pol + config.kl_beta * kl + config.data_beta * data
    total = raw * (config.loss_scale / config.micro_steps)
    return total, {"policy": pol, "kl": kl, "data": data, "unscaled": raw, "ratio": ratio,
                   "log_ratio": log_ratio}


def wfm_rl_loss(sample, mu_theta, mu_old, advantages, config: WFMRLConfig, *, mu_ref=None,
                data_loss=None):
    """(loss, metrics) of one micro-step: the mean of per_sample_loss over rows; metrics are
    constants (cosmos's logged names where it has them)."""
    total, t = per_sample_loss(sample, mu_theta, mu_old, advantages, config, mu_ref=mu_ref,
                               data_loss=data_loss)
    metrics = {
        "loss": jnp.mean(total),
        "mse_loss": jnp.mean(t["unscaled"]),  # cosmos logs the loss before loss_scale
        "policy_loss": jnp.mean(t["policy"]),
        "kl_loss": jnp.mean(t["kl"]),
        "data_loss": jnp.mean(t["data"]),
        "log_prob_ratio": jnp.mean(t["log_ratio"]),
        "ratio": jnp.mean(t["ratio"]),
        "clipfrac": jnp.mean((jnp.abs(t["ratio"] - 1.0) > config.clip_ratio).astype(F32)),
        "advantage": jnp.mean(jnp.asarray(advantages, F32)),
    }
    return jnp.mean(total), jax.tree.map(jax.lax.stop_gradient, metrics)


def rl_step_loss(x0_fn: edm.Denoiser, step: edm.TrajectoryStep, advantages, config: WFMRLConfig, *,
                 micro_step=0, mu_ref=None, data_x0=None, data_x0_fn: edm.Denoiser | None = None,
                 data_sigma=None, data_eps=None, noise=None, condition_mask=None):
    """(loss, metrics) of trained step `step` with the trained denoiser x0_fn (differentiate
    through its parameters). mu_theta = edm.step_mean from the stored churned state.

    The data term (data_beta > 0; only micro_step 0 when data_on_first_only) denoises
    x0 + sigma eps with data_x0_fn (default x0_fn; cosmos applies the text dropout there):
    sigma = step.sigma and eps = the rollout's initial noise under use_rl_sigma_and_noise,
    else data_sigma / data_eps (draw_data_sigma and fresh noise).
    """
    mu_theta, _ = edm.step_mean(x0_fn, step.noise_x, step.sigma, step.sigma_next,
                                solver=config.solver_option, x0_prev=step.x0_prev,
                                sigma_prev=step.sigma_prev, first=step.first)
    data = None
    if config.data_beta > 0:
        if data_x0 is None:
            raise ValueError("data_beta > 0 needs data_x0, the clean latents of the group's clip")
        if config.use_rl_sigma_and_noise:
            if noise is None:
                raise ValueError("use_rl_sigma_and_noise needs the rollout's initial noise")
            sigma = jnp.broadcast_to(jnp.asarray(step.sigma, F32), (data_x0.shape[0],))
            eps = noise
        else:
            if data_sigma is None or data_eps is None:
                raise ValueError("use_rl_sigma_and_noise off needs data_sigma and data_eps")
            sigma, eps = data_sigma, data_eps
        pred = (data_x0_fn or x0_fn)(noisy_data(data_x0, eps, sigma), sigma)
        data = data_loss_per_sample(data_x0, pred, sigma, sigma_data=config.sigma_data,
                                    condition_mask=condition_mask)
        if config.data_on_first_only:
            data = jnp.where(jnp.asarray(micro_step) == 0, data, 0.0)
    return wfm_rl_loss(step.sample, mu_theta, step.mu_old, advantages, config, mu_ref=mu_ref,
                       data_loss=data)


# ----------------------------------------------------------------------------- per-group draws


def rollout_noise(key, shape, config: WFMRLConfig, group_ids=None):
    """The rollout's initial unit noise: with use_same_seed one draw per group (group_ids, by
    default adjacent groups of num_rollout rows), else one per row (edm.initial_noise)."""
    if not config.use_same_seed:
        return edm.initial_noise(key, shape)
    if group_ids is None:
        group_ids = edm.contiguous_group_ids(int(shape[0]), config.num_rollout)
    return edm.initial_noise(key, shape, group_ids)



def draw_train_on(key, train_on, sample_steps: int):
    """(K,) int32 trained steps: the explicit entries in their order, then one distinct random
    untrained step per -1 entry (cosmos draws these once per group)."""
    explicit = [int(i) for i in train_on if int(i) != -1]
    n_random = len(train_on) - len(explicit)
    steps = jnp.asarray(explicit, jnp.int32)
    if not n_random:
        return steps
    rest = np.asarray([i for i in range(sample_steps) if i not in explicit], np.int32)
    if n_random > rest.size:
        raise ValueError(f"train_on {tuple(train_on)} asks for {n_random} random steps, {rest.size} left")
    return jnp.concatenate([steps, jax.random.permutation(key, jnp.asarray(rest))[:n_random]])


def draw_num_conditional_frames(key, lo: int, hi: int):
    """Latent frames given as condition, uniform in [lo, hi] (once per group)."""
    return jax.random.randint(key, (), lo, hi + 1)


def condition_mask(latent_shape, num_frames):
    """(B, 1, T, H, W) float32, 1 on the first `num_frames` latent frames of (B, C, T, H, W)."""
    b, _, t, h, w = latent_shape
    on = jnp.arange(t) < jnp.asarray(num_frames)
    return jnp.broadcast_to(on[None, None, :, None, None], (b, 1, t, h, w)).astype(F32)


def reference_due(iteration, every: int):
    """Whether the reference net copies the policy before this iteration's step: every > 0 and
    iteration % every == 0 (so also at iteration 0); 0 = never."""
    if every <= 0:
        return jnp.asarray(False)
    return jnp.asarray(iteration) % every == 0


def refresh_reference(ref_params, params, iteration, every: int):
    """ref_params, or a copy of params when reference_due; jit-safe pytree select."""
    due = reference_due(iteration, every)
    return jax.tree.map(lambda r, p: jnp.where(due, p, r), ref_params, params)
