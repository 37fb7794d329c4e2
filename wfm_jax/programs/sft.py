"""The SFT train step (rectified flow), as the trainer runs it, the planner lowers it and the
benchmark times it: one jitted program of (state, frozen, x0, cond, ids) -> (state, metrics),
the state donated, shardings fixed.

    t ~ policy.diffusers.weighting_scheme through the family's training table
        (family.train_sigma_table: the scheduler shift; Cosmos: its own range, see there)
    x_t = (1 - sigma) x0 + sigma eps;  loss = mean w(sigma) ||v(x_t, 1000 sigma) - (eps - x0)||^2
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from wfm_jax.algorithms import sft as sft_loss
from wfm_jax.core.mesh import mesh_jit
from wfm_jax.programs import setup as setup_lib
from wfm_jax.programs.encode import per_sample_normal
from wfm_jax.programs.state import train_state_update

KEY_VAE, KEY_T, KEY_NOISE, KEY_COND = 1, 2, 3, 4  # fold_in tags of one micro-step's key


def sample_timesteps(key, ids, table_t, table_s, scheme: str, **density):
    """Per-sample (timesteps, sigmas) from the shifted table, row i from fold_in(key, ids[i])."""
    def one(i):
        _, t, s = sft_loss.sample_training_timesteps(jax.random.fold_in(key, i), 1, table_t,
                                                     table_s, scheme, **density)
        return t[0], s[0]
    return jax.vmap(one)(ids)


def step_draws(key, ids, shape, table_t, table_s, scheme: str, **density):
    """(timesteps, sigmas, noise) of one SFT step for rows `ids` (x0 rows of `shape`), from the
    step's key (the second half of split(state.rng)): the benchmark's torch side gets exactly
    the inputs this step trains on."""
    timesteps, sigmas = sample_timesteps(jax.random.fold_in(key, KEY_T), ids, table_t, table_s,
                                         scheme, **density)
    noise = per_sample_normal(jax.random.fold_in(key, KEY_NOISE), ids, shape)
    return timesteps, sigmas, noise


def loss_args(setup: setup_lib.Setup) -> tuple:
    """(shift, weighting scheme, logit mean, logit std, mode scale, conditional frames (lo, hi))
    of the recipe: what the step's loss depends on besides the state."""
    d = setup.config.policy.diffusers
    return (float(setup.pipe.shift), str(d.weighting_scheme), float(d.logit_mean),
            float(d.logit_std), float(d.mode_scale),
            (int(d.min_num_conditional_frames), int(d.max_num_conditional_frames)))


def _step_key(setup: setup_lib.Setup, args: tuple) -> tuple:
    """Everything the compiled step depends on, hashable: equal keys give equal programs."""
    t = setup.config.train
    optim = (t.optm_lr, t.optm_weight_decay, tuple(t.optm_betas), t.optm_eps,
             t.optm_grad_norm_clip, t.optm_warmup_steps, t.lr_schedule,
             setup_lib.schedule_total_steps(setup.config), t.grad_accum_steps,
             t.ema_enable, t.ema_decay, t.ema_update_step_interval)
    state_leaves, state_def = jax.tree.flatten(setup.shardings)
    frozen_leaves, frozen_def = jax.tree.flatten(setup_lib.shardings_of(setup.frozen))
    return (setup.graphdef, setup.pipe.static_key(), optim, args, tuple(state_leaves),
            state_def, tuple(frozen_leaves), frozen_def, setup.batch_sharding())


_STEPS: dict = {}  # step key -> jitted step: a resumed run in the same process compiles nothing


def sft_step(setup: setup_lib.Setup, args: tuple | None = None, cached: bool = True) -> Callable:
    """jit((state, frozen, x0, cond, ids) -> (state, {"loss", "grad_norm"})); cond is the
    family's conditioning dict, x0 its diffusers-layout latents (4-D images, 5-D video).
    policy.diffusers.max_num_conditional_frames > 0: video2world, each clip conditioned on its
    first n latent frames, n uniform in [min, max] per sample (the family's video_condition).
    args: loss_args(setup) unless given (tests pin a shift or scheme). cached: reuse the
    program of an equal setup (a resumed run in the same process compiles nothing)."""
    args = loss_args(setup) if args is None else tuple(args)
    if not cached:
        return _build(setup, *args)
    key = _step_key(setup, args)
    if key not in _STEPS:
        if len(_STEPS) >= 4:
            _STEPS.pop(next(iter(_STEPS)))
        _STEPS[key] = _build(setup, *args)
    return _STEPS[key]


def _build(setup, shift, scheme, logit_mean, logit_std, mode_scale, cond_frames) -> Callable:
    t_cfg = setup.config.train
    tx, graphdef, family = setup.tx, setup.graphdef, setup.pipe.shell()
    table_t, table_s = (jnp.asarray(a) for a in family.train_sigma_table(shift))
    density = dict(logit_mean=logit_mean, logit_std=logit_std, mode_scale=mode_scale)
    ema_decay = float(t_cfg.ema_decay)
    ema_on = setup_lib.ema_active(setup.config)
    ema_interval = int(t_cfg.ema_update_step_interval) if ema_on else 0

    def step(state, frozen, x0, cond, ids):
        rng, key = jax.random.split(state.rng)
        timesteps, sigmas, noise = step_draws(key, ids, x0.shape[1:], table_t, table_s, scheme,
                                              **density)
        x_t = sft_loss.noisy_latents(x0, noise, sigmas)
        if cond_frames[1] > 0:  # the conditioned frames' loss is zero: their velocity is exact
            k_cond = jax.random.fold_in(key, KEY_COND)
            counts = jax.vmap(lambda i: jax.random.randint(
                jax.random.fold_in(k_cond, i), (), cond_frames[0], cond_frames[1] + 1))(ids)
            cond = {**cond, **family.video_condition(x0, counts)}

        def loss_fn(params):
            model = setup_lib.merge(graphdef, params, frozen)
            v = family.velocity_with(model, x_t, timesteps, cond)
            return sft_loss.flow_matching_loss(v, noise, x0, sigmas, weighting=scheme)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        state, info = train_state_update(state, grads, tx, ema_decay, ema_interval)
        return state.replace(rng=rng), {"loss": loss, "grad_norm": info["grad_norm"]}

    rep = setup_lib.replicated(setup.mesh)
    data = setup.batch_sharding()
    return mesh_jit(step, mesh=setup.mesh, rules=setup.rules, donate_argnums=0,
                    in_shardings=(setup.shardings, setup_lib.shardings_of(setup.frozen), data,
                                  data, data),
                    out_shardings=(setup.shardings, {"loss": rep, "grad_norm": rep}))
