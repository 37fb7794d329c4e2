"""wfm_jax.algorithms.lm_grpo against an independent numpy implementation of cosmos-rl's GRPO for
language models (reason2.md 4.2), written here from the formulas on cosmos-rl's own data layout:
ragged per-sequence token arrays (no masks), hand-derived gradients, and its two variants' batches:
"dapo" drops the groups of equal rewards from the list before it is cut into mini-batches, "grpo"
keeps them (advantage 0: no loss of their own, but their tokens count in the token-mean)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.algorithms import lm_grpo as lmg

# -- the numpy reference ----------------------------------------------------------------------------


def np_advantages(rewards, unbiased=False, eps=1e-6):
    out = []
    for r in np.asarray(rewards, np.float32):
        out.append(r - r.mean() if unbiased else (r - r.mean()) / (np.std(r) + eps))
    return np.asarray(out, np.float32)


def np_token(x, old, ref, a, cfg):
    """Per-token policy loss, kl and their derivatives by x (the current log-prob), for one sequence."""
    lr = x - old
    r = np.exp(np.clip(lr, -20, 20))
    dr = np.where(np.abs(lr) < 20, r, 0.0)
    lo = 1 - cfg.epsilon_low if cfg.epsilon_low >= 0 else -np.inf
    hi = 1 + cfg.epsilon_high if cfg.epsilon_high >= 0 else np.inf
    c = np.clip(r, lo, hi)
    dc = np.where((r > lo) & (r < hi), dr, 0.0)
    u_val, c_val = r * a, c * a
    clip1 = -np.minimum(u_val, c_val)
    # d(-min(u, c)): the smaller branch's slope; ties split evenly (as jnp.minimum and torch.min do)
    d1 = np.where(u_val < c_val, -a * dr, np.where(c_val < u_val, -a * dc, -a * (dr + dc) / 2))
    if a < 0:
        bound = -cfg.lower_bound_ratio * a
        loss = np.minimum(bound, clip1)
        dloss = np.where(bound < clip1, 0.0, np.where(clip1 < bound, d1, d1 / 2))
    else:
        loss, dloss = clip1, d1
    d = np.clip(ref - x, -20, 20)
    dd = np.where(np.abs(ref - x) < 20, -1.0, 0.0)
    k3 = np.exp(d) - d - 1
    dk3 = (np.exp(d) - 1) * dd
    if cfg.unbiased_kl_estimate:
        w = np.exp(x - old)
        k3, dk3 = w * k3, w * k3 + w * dk3
    kl = np.clip(k3, -10, 10)
    dkl = np.where(np.abs(k3) < 10, dk3, 0.0)
    return loss, dloss, kl, dkl


def np_reduce(values, lengths, loss_type, max_tokens=None, n_tokens=None, scale=1.0):
    """Weights w_i,t with reduction = sum_i,t w_i,t v_i,t (cosmos-rl compute_loss's loss_type)."""
    b = len(lengths)
    if loss_type == "token-mean":
        n = sum(lengths) if n_tokens is None else n_tokens
        return [np.full(k, scale / (n + 1e-8)) for k in lengths]
    if loss_type == "token-sum":
        return [np.ones(k) for k in lengths]
    if loss_type == "seq-mean-token-sum":
        return [np.full(k, 1.0 / b) for k in lengths]
    return [np.full(k, 1.0 / b / (max_tokens or k)) for k in lengths]  # seq-mean-token-mean


def np_minibatch(seqs, cfg, n_tokens=None, scale=1.0):
    """One mini-batch: (loss, [dloss/dx per sequence])."""
    parts = [np_token(s["x"], s["old"], s["ref"], s["a"], cfg) for s in seqs]
    w = np_reduce(None, [len(s["x"]) for s in seqs], cfg.loss_type, cfg.unbiased_loss_max_tokens, n_tokens,
                  scale)
    loss = sum((wi * (p[0] + cfg.kl_beta * p[2])).sum() for wi, p in zip(w, parts, strict=True))
    grads = [wi * (p[1] + cfg.kl_beta * p[3]) for wi, p in zip(w, parts, strict=True)]
    return loss, grads


def np_step(ranks, cfg):
    """ranks: per DP rank, its list of valid sequences. Each rank splits its list into mini-batches,
    scales each by len(mb)/len(list); the gradient all-reduce averages the ranks."""
    dp, mb = len(ranks), cfg.mini_batch
    total, grads = 0.0, [[None] * len(r) for r in ranks]
    n_mb = max(-(-len(r) // mb) for r in ranks)
    for m in range(n_mb):
        pieces = [r[m * mb:(m + 1) * mb] for r in ranks]
        n_all = sum(len(s["x"]) for p in pieces for s in p)
        for k, (rank, piece) in enumerate(zip(ranks, pieces, strict=True)):
            if not piece:
                continue
            if cfg.balance_dp_token and cfg.loss_type == "token-mean":
                loss, g = np_minibatch(piece, cfg, n_all, float(dp))
            else:
                loss, g = np_minibatch(piece, cfg)
            f = len(piece) / len(rank) / dp
            total += f * loss
            for j, gi in enumerate(g):
                grads[k][m * mb + j] = f * gi
    return total, grads


# -- fixtures: a batch in both layouts --------------------------------------------------------------


def make_batch(seed, groups=4, n=4, t=9, zero_groups=(1,), spread=1.0):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, (groups, n)).astype(np.float32)
    rewards[:, 0], rewards[:, 1] = 0.0, 1.0  # every group informative ...
    for g in zero_groups:
        rewards[g] = 1.0  # ... except these (all equal: zero advantage, filtered)
    b = groups * n
    lengths = rng.integers(1, t + 1, b)
    x = rng.normal(-2.0, 1.0, (b, t)).astype(np.float32)
    old = (x + rng.normal(0.0, spread, (b, t))).astype(np.float32)  # ratios from ~0.2 to ~5
    ref = (x + rng.normal(0.0, 0.5, (b, t))).astype(np.float32)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
    return rewards, x, old, ref, mask, lengths


def jax_step(x, old, ref, rewards, mask, cfg, dp_size=1):
    """The pipeline a trainer runs: advantages, ("dapo") filter and compaction, accumulated loss;
    grad by x."""
    adv = np.asarray(lmg.group_advantages(rewards, unbiased=cfg.unbiased_advantage)).reshape(-1)
    keep = (np.asarray(lmg.keep_rows(rewards)) if cfg.variant == "dapo"
            else np.ones(rewards.size, bool))
    order = lmg.compact_order(keep)
    m = (mask * keep[:, None])[order]
    fn = lambda xx: lmg.accumulated_grpo_loss(xx, old[order], ref[order], adv[order], m, cfg, dp_size)
    (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(x[order]))
    full = np.zeros_like(x)
    full[order] = np.asarray(grad)
    return float(loss), full, aux, keep, adv


def np_reference(x, old, ref, rewards, lengths, cfg, dp_size=1):
    adv = np_advantages(rewards, cfg.unbiased_advantage).reshape(-1)
    valid = [g for g in range(rewards.shape[0])
             if cfg.variant == "grpo" or len(set(rewards[g].tolist())) > 1]
    n = rewards.shape[1]
    rows = [g * n + i for g in valid for i in range(n)]
    seqs = [{"x": x[i, :lengths[i]].astype(np.float64), "old": old[i, :lengths[i]].astype(np.float64),
             "ref": ref[i, :lengths[i]].astype(np.float64), "a": float(adv[i]), "row": i} for i in rows]
    per = len(seqs) // dp_size
    ranks = [seqs[k * per:(k + 1) * per] for k in range(dp_size)]
    loss, grads = np_step(ranks, cfg)
    full = np.zeros(x.shape)
    for rank, g in zip(ranks, grads, strict=True):
        for s, gi in zip(rank, g, strict=True):
            full[s["row"], :len(gi)] = gi
    return loss, full


LOSS_CASES = list(itertools.product(lmg.LOSS_TYPES, [0.0, 0.05], [False, True]))


@pytest.mark.parametrize(("loss_type", "kl_beta", "unbiased_kl"), LOSS_CASES)
def test_step_loss_and_grad_match_numpy(loss_type, kl_beta, unbiased_kl):
    """Variant "dapo": the equal-reward group (rows 4-7) is dropped before the mini-batches."""
    rewards, x, old, ref, mask, lengths = make_batch(0)
    cfg = lmg.LMGRPOConfig(n_generation=4, loss_type=loss_type, kl_beta=kl_beta, variant="dapo",
                           unbiased_kl_estimate=unbiased_kl, mini_batch=3)  # 12 valid rows: 4 x 3
    loss, grad, aux, keep, _ = jax_step(x, old, ref, rewards, mask, cfg)
    want, want_grad = np_reference(x, old, ref, rewards, lengths, cfg)
    assert keep.tolist() == [True] * 4 + [False] * 4 + [True] * 8
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=1e-7)
    assert np.all(grad[mask == 0] == 0) and np.all(grad[4:8] == 0)  # padding and filtered rows
    assert 0.0 < float(aux["clip_fraction"]) < 1.0  # the data exercises clipped and unclipped tokens


@pytest.mark.parametrize(("loss_type", "kl_beta"), [("token-mean", 0.0), ("token-mean", 0.05),
                                                    ("seq-mean-token-mean", 0.0), ("token-sum", 0.05)])
def test_grpo_variant_trains_equal_reward_groups_with_zero_advantage(loss_type, kl_beta):
    """Variant "grpo" (cosmos-rl's default): the equal-reward group stays in the mini-batches. Its
    rows add no policy loss, but their tokens divide the token-mean (the same batch gives a
    smaller loss than "dapo"), their KL counts, and they shift which rows share a mini-batch."""
    rewards, x, old, ref, mask, lengths = make_batch(0)
    cfg = lmg.LMGRPOConfig(n_generation=4, loss_type=loss_type, kl_beta=kl_beta, mini_batch=3)
    loss, grad, _, keep, adv = jax_step(x, old, ref, rewards, mask, cfg)
    want, want_grad = np_reference(x, old, ref, rewards, lengths, cfg)
    assert keep.all() and np.all(adv[4:8] == 0)
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=1e-7)
    dapo = jax_step(x, old, ref, rewards, mask, cfg.replace(variant="dapo"))
    assert abs(loss - dapo[0]) > 1e-4  # the variants differ on this batch
    assert np.any(grad[4:8] != 0) == (kl_beta > 0)  # the zero-advantage rows: only their KL


def test_unknown_variant_is_one_line():
    with pytest.raises(ValueError, match="variant 'gspo'"):
        lmg.LMGRPOConfig(variant="gspo")


@pytest.mark.parametrize(("balance", "loss_type"), [(False, "token-mean"), (True, "token-mean"),
                                                    (True, "seq-mean-token-mean")])
def test_data_parallel_token_balance_matches_numpy(balance, loss_type):
    rewards, x, old, ref, mask, lengths = make_batch(1, groups=4, n=4, zero_groups=())
    cfg = lmg.LMGRPOConfig(n_generation=4, mini_batch=2, balance_dp_token=balance, loss_type=loss_type)
    loss, grad, *_ = jax_step(x, old, ref, rewards, mask, cfg, dp_size=2)
    want, want_grad = np_reference(x, old, ref, rewards, lengths, cfg, dp_size=2)
    np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=1e-7)


def test_first_mu_iteration_ratio_one_and_unbiased_advantage():
    """old_logp=None: the policy before the update (ratio 1): token-mean loss = -sum(A n_i) / sum(n_i)."""
    rewards, x, _, _, mask, lengths = make_batch(2, zero_groups=())
    cfg = lmg.LMGRPOConfig(n_generation=4, mini_batch=16, unbiased_advantage=True)
    adv = np.asarray(lmg.group_advantages(rewards, unbiased=True)).reshape(-1)
    step = jax.value_and_grad(lambda xx: lmg.grpo_loss(xx, None, None, adv, mask, cfg)[0])
    loss, grad = step(jnp.asarray(x))
    np.testing.assert_allclose(float(loss), -(adv * lengths).sum() / lengths.sum(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), -adv[:, None] * mask / lengths.sum(), rtol=1e-5, atol=1e-8)
    same = lmg.accumulated_grpo_loss(x, x, None, adv, mask, cfg)[0]
    np.testing.assert_allclose(float(same), float(loss), rtol=1e-6)


def test_advantages_and_group_filter_match_numpy():
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(5, 8)).astype(np.float32)
    rewards[2] = 0.7
    rewards[3, :] = [0.0] * 7 + [1e-6]  # nearly, not exactly, equal: kept
    for unbiased in (False, True):
        got = np.asarray(lmg.group_advantages(rewards, unbiased=unbiased))
        np.testing.assert_allclose(got, np_advantages(rewards, unbiased), rtol=1e-5, atol=1e-6)
    flat = np.asarray(lmg.group_advantages(rewards.reshape(-1), 8))
    np.testing.assert_allclose(flat, np_advantages(rewards).reshape(-1), rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(lmg.group_advantages(rewards))[2] == 0)
    assert np.asarray(lmg.group_keep(rewards)).tolist() == [True, True, False, True, True]
    assert np.asarray(lmg.keep_rows(rewards)).sum() == 32
    order = lmg.compact_order(np.asarray(lmg.keep_rows(rewards)))
    assert order[:16].tolist() == list(range(16)) and order[-8:].tolist() == list(range(16, 24))
    with pytest.raises(ValueError, match="n_generation"):
        lmg.group_advantages(np.zeros(10), 4)


def test_logprobs_from_logits_with_temperature_and_prefix_mask():
    """Gradients through log_softmax(logits / T) at the next token, with the shifted completion mask."""
    rng = np.random.default_rng(4)
    b, length, v, temp = 3, 7, 11, 0.7
    logits = rng.normal(size=(b, length, v)).astype(np.float32)
    ids = rng.integers(0, v, (b, length))
    prompt = np.array([2, 3, 1])
    completion = (np.arange(length)[None] >= prompt[:, None]).astype(np.int32)
    completion[0, 6:] = 0  # right padding after the completion
    ignore = np.array([0, 1, 2])
    mask = np.asarray(lmg.completion_logprob_mask(completion, ignore))
    want_mask = np.zeros((b, length - 1))
    for i in range(b):
        pos = [t - 1 for t in range(1, length) if completion[i, t]][ignore[i]:]
        want_mask[i, pos] = 1
    np.testing.assert_array_equal(mask, want_mask)
    adv = np.array([1.0, -0.5, 0.25], np.float32)
    cfg = lmg.LMGRPOConfig(temperature=temp, mini_batch=3)

    def f(lg):
        logp = lmg.next_token_logprobs(lg, ids, cfg.temperature)
        return lmg.grpo_loss(logp, None, None, adv, mask, cfg)[0]

    grad = np.asarray(jax.grad(f)(jnp.asarray(logits)))
    z = logits[:, :-1].astype(np.float64) / temp
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(v)[ids[:, 1:]]
    dlogp = -adv[:, None] * want_mask / want_mask.sum()  # ratio 1: d loss / d logp
    want = np.zeros_like(logits, dtype=np.float64)
    want[:, :-1] = dlogp[..., None] * (onehot - p) / temp
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)
    logp = np.asarray(lmg.next_token_logprobs(logits, ids, temp))
    np.testing.assert_allclose(logp, np.log((p * onehot).sum(-1)), rtol=1e-5, atol=1e-6)


def test_config_defaults_and_errors():
    cfg = lmg.LMGRPOConfig()
    assert (cfg.epsilon_low, cfg.epsilon_high, cfg.lower_bound_ratio, cfg.kl_beta, cfg.mu_iterations,
            cfg.mini_batch, cfg.loss_type, cfg.unbiased_advantage, cfg.n_generation) == \
        (0.2, 0.2, 3.0, 0.0, 1, 2, "token-mean", False, 16)
    assert cfg.rollout_temperature == 1.0 and cfg.replace(temperature=0.9).rollout_temperature == 0.9
    assert cfg.replace(temperature=0.9, sampling_temperature=1.0).rollout_temperature == 1.0
    with pytest.raises(ValueError, match="loss_type"):
        lmg.LMGRPOConfig(loss_type="seq-mean")
    with pytest.raises(ValueError, match="ref_logp"):
        lmg.grpo_loss(np.zeros((1, 2)), None, None, np.ones(1), np.ones((1, 2)), cfg.replace(kl_beta=0.1))
    with pytest.raises(ValueError, match="dp_size"):
        lmg.accumulated_grpo_loss(np.zeros((3, 2)), None, None, np.ones(3), np.ones((3, 2)), cfg, dp_size=2)
