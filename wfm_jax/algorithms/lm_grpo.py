"""GRPO for language models as cosmos-rl computes it (shared/specs/reason2.md 4.2), as pure array
functions: a trainer feeds them the policy's log-probs, the rollout's rewards and masks.

cosmos-rl sources: advantages `cosmos_rl/dispatcher/algo/grpo.py` (GRPO.compute_advantage), the
group filter `cosmos_rl/reward/local_calculator.py` (a group whose filter rewards are all equal is
marked invalid), what each variant does with invalid groups (`cosmos_rl/dispatcher/controller.py`
put_rollouts since its first release, `rollout/worker/rollout_control.py` dynamic_sampling since
2025-11): "grpo" trains on every group, an all-equal group's rows with advantage 0 (they add
nothing to the loss's sum but count in its token-mean); "dapo" drops invalid groups and draws more
prompts until the step holds train_batch_per_replica rows of valid ones; the loss
`cosmos_rl/policy/trainer/llm_trainer/grpo_trainer.py` (compute_loss, and step_training's
mini-batch scaling `loss_scaling_factor = len(mini_batch) / len(batch)`).

Shapes: G prompts x N completions; B = G*N rows (group-major: row g*N + i); T completion-aligned
token positions. `mask` [B, T] is cosmos-rl's logprob mask: 1 where the position's log-prob is that
of a completion token (after `n_ignore_prefix_tokens`), 0 on prompt, padding and dropped rows.
Per token (the dual-clip PPO loss of both variants):
  ratio = exp(clip(logp - logp_old, -20, 20))
  l     = -min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A);  A < 0: l = min(l, -lower_bound_ratio A)
  kl    = clip(exp(ref - logp) - (ref - logp) - 1, -10, 10)    (k3; ref - logp clipped to +-20 first;
                                                                 unbiased_kl_estimate: ratio * k3)
  loss  = agg(l) + kl_beta agg(kl), agg by loss_type over one mini-batch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
LOSS_TYPES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum")
VARIANTS = ("grpo", "dapo")  # train.train_policy.variant (cosmos-rl's "gspo" is not here)
LOG_RATIO_CLAMP = 20.0  # compute_loss: torch.clamp(logp - old, -20, 20) before exp
KL_CLAMP = 10.0  # compute_loss: k3 clamped to [-10, 10]
TOKEN_MEAN_EPS = 1e-8  # compute_loss: sum / (n_tokens + 1e-8)


@dataclass(frozen=True)
class LMGRPOConfig:
    """cosmos-rl's defaults; each field names its TOML key (GrpoConfig unless said otherwise)."""

    n_generation: int = 16  # rollout.n_generation (completions per prompt: the group size N)
    # train.train_policy.temperature: divides the policy logits before log_softmax. cosmos-rl's sampler
    # uses rollout.sampling_config.temperature instead (default 1.0; the Reason1 recipe sets 0.9 here
    # only, so its ratios are against a different distribution). We sample at sampling_temperature,
    # which is this value unless set: the two agree by default.
    temperature: float = 1.0
    sampling_temperature: float | None = None  # rollout.sampling_config.temperature (None: = temperature)
    top_p: float = 1.0  # rollout.sampling_config.top_p
    top_k: int = -1  # rollout.sampling_config.top_k (-1: off)
    repetition_penalty: float = 1.0  # rollout.sampling_config.repetition_penalty
    max_response_length: int = 2048  # rollout.max_response_length
    epsilon_low: float = 0.2  # train.train_policy.epsilon_low (< 0: no lower clip)
    epsilon_high: float = 0.2  # train.train_policy.epsilon_high (< 0: no upper clip)
    lower_bound_ratio: float = 3.0  # train.train_policy.lower_bound_ratio (dual clip for A < 0)
    kl_beta: float = 0.0  # train.train_policy.kl_beta (0: no reference model)
    unbiased_kl_estimate: bool = False  # train.train_policy.unbiased_kl_estimate
    loss_type: str = "token-mean"  # train.train_policy.loss_type
    unbiased_loss_max_tokens: int | None = None  # train.train_policy.unbiased_loss_max_tokens (Dr.GRPO)
    unbiased_advantage: bool = False  # train.train_policy.unbiased_advantage (A = r - mean)
    advantage_eps: float = 1e-6  # GRPO(eps=1e-6) in dispatcher/algo/grpo.py (no TOML key)
    mu_iterations: int = 1  # train.train_policy.mu_iterations
    mini_batch: int = 2  # train.train_policy.mini_batch (rollouts per gradient-accumulation step)
    batch_size_per_optimize: int | None = None  # train.train_policy.batch_size_per_optimize
    balance_dp_token: bool = False  # train.train_policy.balance_dp_token
    min_filter_prefix_tokens: int | None = None  # train.train_policy.min_filter_prefix_tokens
    variant: str = "grpo"  # train.train_policy.variant: what becomes of groups of equal filter rewards
    # train.train_policy.max_retry_for_on_policy: "dapo" draws at most this many batches of prompts
    # for one step (<= 0: until the dataset's prompts are used up)
    max_retry_for_on_policy: int = -1

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r}: expected one of {LOSS_TYPES}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant {self.variant!r}: expected one of {VARIANTS}")
        for name in ("n_generation", "mini_batch", "mu_iterations", "max_response_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0 or (self.sampling_temperature is not None
                                        and not self.sampling_temperature > 0):
            raise ValueError(f"temperatures must be > 0, got temperature={self.temperature}, "
                             f"sampling_temperature={self.sampling_temperature}")
        if self.lower_bound_ratio <= 1.0:
            raise ValueError(f"lower_bound_ratio must be > 1 (cosmos-rl default 3.0), "
                             f"got {self.lower_bound_ratio}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.unbiased_loss_max_tokens is not None and self.unbiased_loss_max_tokens <= 0:
            raise ValueError(f"unbiased_loss_max_tokens must be > 0 or None, "
                             f"got {self.unbiased_loss_max_tokens}")

    @property
    def rollout_temperature(self) -> float:
        return self.temperature if self.sampling_temperature is None else self.sampling_temperature

    def replace(self, **changes) -> LMGRPOConfig:
        return dataclasses.replace(self, **changes)


# -- rewards -> advantages, and the group filter ---------------------------------------------------
def _groups(rewards, n_generation: int | None):
    r = jnp.asarray(rewards, F32)
    if r.ndim == 1:
        if not n_generation or r.shape[0] % n_generation:
            raise ValueError(f"{r.shape[0]} rewards do not split into groups of n_generation={n_generation}")
        r = r.reshape(-1, n_generation)
    if r.ndim != 2:
        raise ValueError(f"rewards of shape {r.shape}: expected [G, N] or [G*N] with n_generation")
    return r


def group_advantages(rewards, n_generation: int | None = None, *, unbiased: bool = False,
                     eps: float = 1e-6):
    """cosmos-rl GRPO.compute_advantage per group, in float32: (r - mean) / (std(ddof=0) + eps), or
    r - mean when unbiased. rewards [G, N] (or [G*N] with n_generation) -> same shape as given.
    A group of equal rewards gets exactly 0: a float32 mean that is off by one ulp would otherwise
    come out as ulp / eps (~0.06 for rewards of 0.7); cosmos-rl drops such groups anyway."""
    shape = jnp.shape(rewards)
    r = _groups(rewards, n_generation)
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    adv = centred if unbiased else centred / (jnp.std(r, axis=1, keepdims=True) + eps)
    return jnp.where(group_keep(r)[:, None], adv, 0.0).reshape(shape)


def group_keep(rewards, n_generation: int | None = None):
    """bool [G]: the valid groups, those whose (filter) rewards are not all equal (exact comparison,
    as cosmos-rl's `len(set(filter_rewards)) > 1`). Variant "dapo" trains on these only; a group of
    equal total rewards has zero advantages either way."""
    r = _groups(rewards, n_generation)
    return jnp.any(r != r[:, :1], axis=1)


def keep_rows(rewards, n_generation: int | None = None):
    """bool [G*N]: group_keep broadcast to each completion (row-major, group by group)."""
    r = _groups(rewards, n_generation)
    return jnp.repeat(group_keep(r), r.shape[1])


def compact_order(keep_rows_mask) -> np.ndarray:
    """Host-side row order putting kept rows first (stable), so mini-batches of the kept rows line up
    as cosmos-rl's "dapo" ones (it drops invalid groups before splitting the batch into mini-batches)."""
    keep = np.asarray(keep_rows_mask, bool).reshape(-1)
    return np.concatenate([np.flatnonzero(keep), np.flatnonzero(~keep)])


def ignore_prefix_lengths(completions: Sequence[Sequence[int]], rewards: Sequence[float],
                          min_tokens: int | None) -> list[int]:
    """cosmos-rl's n_ignore_prefix_tokens of one group (reward/local_calculator.py with
    utils/util.find_maximal_prefix_groups): in a trie of the completions' tokens, a maximal group
    is a node at depth >= min_tokens that 2+ completions pass through and none of whose children
    does; when its completions' rewards differ, each of them but one equal to the prefix itself
    leaves the prefix's tokens out of the loss. Groups of equal rewards: 0s. (cosmos-rl walks only
    the groups its filter keeps; the trainer passes min_tokens None for the others.)"""
    out = [0] * len(completions)
    if min_tokens is None or min_tokens < 1 or len(set(rewards)) <= 1:
        return out
    root: dict = {"idxs": [], "kids": {}}
    for i, seq in enumerate(completions):
        node = root
        for token in seq:
            node = node["kids"].setdefault(int(token), {"idxs": [], "kids": {}})
            node["idxs"].append(i)
    stack = [(child, 1) for child in root["kids"].values()]  # explicit: completions run long
    while stack:
        node, depth = stack.pop()
        kids = node["kids"].values()
        maximal = depth >= min_tokens and len(node["idxs"]) > 1 and all(len(k["idxs"]) < 2 for k in kids)
        if maximal and len({rewards[i] for i in node["idxs"]}) > 1:
            for i in node["idxs"]:
                if len(completions[i]) != depth:  # the completion is more than the prefix
                    out[i] = depth
        stack.extend((k, depth + 1) for k in kids if len(k["idxs"]) > 1)
    return out


# -- log-probs and masks ---------------------------------------------------------------------------
def token_logprobs(logits, targets, temperature: float = 1.0):
    """log_softmax(logits / temperature)[targets] in float32: logits [..., V], targets [...]."""
    x = jnp.asarray(logits).astype(F32)
    if temperature > 1e-6 and temperature != 1.0:  # as grpo_trainer: no division at ~0 or 1
        x = x / temperature
    logp = jax.nn.log_softmax(x, axis=-1)
    return jnp.take_along_axis(logp, jnp.asarray(targets)[..., None].astype(jnp.int32), axis=-1)[..., 0]


def next_token_logprobs(logits, input_ids, temperature: float = 1.0):
    """Log-prob of each next token: logits [B, L, V] of input_ids [B, L] -> [B, L-1] (position t scores
    input_ids[:, t+1]; the last prompt token's logits predict the first completion token)."""
    return token_logprobs(jnp.asarray(logits)[:, :-1], jnp.asarray(input_ids)[:, 1:], temperature)


def completion_logprob_mask(completion_mask, n_ignore_prefix=None):
    """completion_mask [B, L] (1 on the completion tokens of input_ids) -> the logprob mask [B, L-1]
    aligned with next_token_logprobs, without each row's first n_ignore_prefix [B] completion tokens
    (cosmos-rl's n_ignore_prefix_tokens, set by min_filter_prefix_tokens)."""
    m = jnp.asarray(completion_mask).astype(jnp.int32)[:, 1:]
    if n_ignore_prefix is not None:
        seen = jnp.cumsum(m, axis=1)
        m = m * (seen > jnp.asarray(n_ignore_prefix, jnp.int32).reshape(-1, 1))
    return m.astype(F32)


# -- the loss -------------------------------------------------------------------------------------
def policy_token_loss(logp, old_logp, advantages, cfg: LMGRPOConfig):
    """Per-token dual-clip PPO loss [B, T] and its clipped-token indicator; advantages [B] or [B, T]."""
    adv = jnp.asarray(advantages, F32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    ratio = jnp.exp(jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    lo = 1.0 - cfg.epsilon_low if cfg.epsilon_low >= 0 else None
    hi = 1.0 + cfg.epsilon_high if cfg.epsilon_high >= 0 else None
    clipped = ratio if lo is None and hi is None else jnp.clip(ratio, lo, hi)
    clip1 = -jnp.minimum(ratio * adv, clipped * adv)
    dual = jnp.minimum(-cfg.lower_bound_ratio * adv, clip1)
    loss = jnp.where(adv < 0, dual, clip1)
    was_clipped = (clipped * adv < ratio * adv) | ((adv < 0) & (dual < clip1))
    return loss, was_clipped


def kl_token_loss(logp, ref_logp, old_logp, cfg: LMGRPOConfig):
    """k3 estimate of KL(pi || ref) per token [B, T] (reference and old log-probs are constants)."""
    d = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = jnp.exp(d) - d - 1.0
    if cfg.unbiased_kl_estimate:
        k3 = jnp.exp(logp - old_logp) * k3
    return jnp.clip(k3, -KL_CLAMP, KL_CLAMP)


def aggregate(per_token, mask, loss_type: str = "token-mean", unbiased_loss_max_tokens: int | None = None,
              token_count=None, token_scale: float = 1.0):
    """cosmos-rl's loss_type reduction over one mini-batch [B, T] -> scalar. Rows with no token
    (padding rows of a fixed-shape batch) count in no mean. With balance_dp_token, token-mean is
    sum / (token_count + 1e-8) * token_scale: all ranks' tokens of the mini-batch, times dp size."""
    mask = jnp.asarray(mask, F32)
    seq_sum = jnp.sum(per_token * mask, axis=1)
    lengths = jnp.sum(mask, axis=1)
    rows = jnp.maximum(jnp.sum(lengths > 0), 1)
    if loss_type == "token-mean":
        n = jnp.sum(lengths) if token_count is None else token_count
        return jnp.sum(seq_sum) / (n + TOKEN_MEAN_EPS) * token_scale
    if loss_type == "token-sum":
        return jnp.sum(seq_sum)
    if loss_type == "seq-mean-token-sum":
        return jnp.sum(seq_sum) / rows
    if loss_type == "seq-mean-token-mean":
        norm = float(unbiased_loss_max_tokens) if unbiased_loss_max_tokens else jnp.maximum(lengths, 1.0)
        return jnp.sum(jnp.where(lengths > 0, seq_sum / norm, 0.0)) / rows
    raise ValueError(f"loss_type {loss_type!r}: expected one of {LOSS_TYPES}")


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, cfg: LMGRPOConfig, token_count=None,
              token_scale: float = 1.0):
    """One mini-batch's loss as compute_loss returns it -> (loss, aux). logp [B, T] carries the
    gradient; old_logp None means the policy itself before the update (first mu iteration: ratio 1);
    ref_logp is needed only when kl_beta != 0. aux: policy_loss, kl_loss, clip_fraction."""
    logp = jnp.asarray(logp, F32)
    old = jax.lax.stop_gradient(logp if old_logp is None else jnp.asarray(old_logp, F32))
    per_token, was_clipped = policy_token_loss(logp, old, advantages, cfg)
    agg = lambda x: aggregate(x, mask, cfg.loss_type, cfg.unbiased_loss_max_tokens, token_count, token_scale)
    policy = agg(per_token)
    if cfg.kl_beta != 0.0:
        if ref_logp is None:
            raise ValueError("kl_beta != 0 needs the reference policy's log-probs (ref_logp)")
        kl = agg(kl_token_loss(logp, jnp.asarray(ref_logp, F32), old, cfg))
    else:
        kl = jnp.zeros((), F32)
    m = jnp.asarray(mask, F32)
    clip_fraction = jnp.sum(was_clipped * m) / jnp.maximum(jnp.sum(m), 1.0)
    return policy + cfg.kl_beta * kl, {"policy_loss": policy, "kl_loss": kl, "clip_fraction": clip_fraction}


def accumulated_grpo_loss(logp, old_logp, ref_logp, advantages, mask, cfg: LMGRPOConfig, dp_size: int = 1):
    """The loss whose gradient is what cosmos-rl accumulates into one optimizer step over these B rows
    (one batch_size_per_optimize chunk): rows split into dp_size ranks (contiguous, rank-major), each
    rank's rows into mini-batches of cfg.mini_batch, each mini-batch's grpo_loss scaled by
    len(mini-batch) / len(rank's rows), summed, then averaged over ranks (the gradient all-reduce).
    With balance_dp_token, token-mean divides by the mini-batch's tokens over all ranks times dp_size.
    Rows without any masked token (dropped groups, padding) are not rows: compact them to the end
    (compact_order) so the real rows form the same mini-batches as in cosmos-rl. Variant "grpo"
    keeps an all-equal group's rows in the mask: advantage 0, their tokens in the token-mean.
    -> (loss, aux)."""
    mask, logp = jnp.asarray(mask, F32), jnp.asarray(logp, F32)
    b = mask.shape[0]
    if b % dp_size:
        raise ValueError(f"{b} rows do not split over dp_size={dp_size} ranks")
    per_rank, mb = b // dp_size, cfg.mini_batch
    real = (jnp.sum(mask, axis=1) > 0).astype(F32)
    old = None if old_logp is None else jnp.asarray(old_logp, F32)
    ref = None if ref_logp is None else jnp.asarray(ref_logp, F32)
    adv = jnp.asarray(advantages, F32)
    total, aux_sum = jnp.zeros((), F32), None
    for start in range(0, per_rank, mb):
        tokens_all, token_scale = None, 1.0
        if cfg.balance_dp_token and cfg.loss_type == "token-mean":  # all ranks' tokens of mini-batch m
            tokens_all = sum(jnp.sum(mask[r * per_rank + start:r * per_rank + min(start + mb, per_rank)])
                             for r in range(dp_size))
            token_scale = float(dp_size)
        for r in range(dp_size):
            lo, hi = r * per_rank + start, r * per_rank + min(start + mb, per_rank)
            rows = slice(lo, hi)
            n_rank = jnp.maximum(jnp.sum(real[r * per_rank:(r + 1) * per_rank]), 1.0)
            scale = jnp.sum(real[rows]) / n_rank / dp_size
            loss, aux = grpo_loss(logp[rows], None if old is None else old[rows],
                                  None if ref is None else ref[rows], adv[rows], mask[rows], cfg, tokens_all,
                                  token_scale)
            total = total + scale * loss
            aux = {k: scale * v for k, v in aux.items()}
            aux_sum = aux if aux_sum is None else {k: aux_sum[k] + aux[k] for k in aux}
    return total, aux_sum
