"""Classifier-free guidance with the conditional and unconditional branch in ONE forward (spec §2).

`cond` and `uncond` are pytrees of arrays with a leading batch axis (e.g. a dict with
"prompt_embeds" and "pooled_projections" for SD3). Leaves of `uncond` with batch 1 (one empty negative
prompt) are broadcast to the batch. The combined batch pairs each row's branches, uncond then
cond (u_0, c_0, u_1, c_1, ...), not diffusers' [uncond; cond]: the rows are split over devices,
and a pair keeps both halves of a row on its device, where [uncond; cond] moved every device's
rows to others (all-to-all and collective-permutes in each sampler step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def uses_cfg(uncond, cfg_scale) -> bool:
    """CFG runs when an unconditional branch is given and the scale is not a python number <= 1
    (diffusers: do_classifier_free_guidance = guidance_scale > 1). A traced scale always guides."""
    if uncond is None:
        if isinstance(cfg_scale, (int, float)) and cfg_scale > 1:
            raise ValueError(f"cfg_scale={cfg_scale} > 1 needs an unconditional embedding (uncond)")
        return False
    return not (isinstance(cfg_scale, (int, float)) and cfg_scale <= 1)


def _pairs(u, c):
    """(B, ...) twice -> (2B, ...) with rows u_0, c_0, u_1, c_1, ...: each row's two branches lie
    side by side, so rows split over devices keep both on their own device."""
    return jnp.stack([u, c], axis=1).reshape((2 * c.shape[0],) + c.shape[1:])


def paired_cond(cond, uncond):
    """The conditioning of guided_velocity's doubled batch: each row's unconditional then
    conditional entry (_pairs), broadcasting batch-1 uncond leaves."""

    def pair(c, u):
        c, u = jnp.asarray(c), jnp.asarray(u)
        if u.shape[0] != c.shape[0]:
            if u.shape[0] != 1:
                raise ValueError(f"uncond batch {u.shape[0]} does not match cond batch {c.shape[0]}")
            u = jnp.broadcast_to(u, (c.shape[0],) + u.shape[1:])
        return _pairs(u.astype(c.dtype), c)

    return jax.tree.map(pair, cond, uncond)


def cfg_combine(v_cond, v_uncond, cfg_scale):
    """diffusers' classifier-free guidance: v_u + g (v_c - v_u) (the default `guide`)."""
    return v_uncond + jnp.asarray(cfg_scale, jnp.float32) * (v_cond - v_uncond)


def guided_velocity(velocity_fn, x, timesteps, cond, uncond=None, cfg_scale=1.0, detach_uncond=False,
                    guide=None):
    """v = guide(v_c, v_u, g) from one batched call of velocity_fn(x, timesteps, cond), fp32.

    timesteps: (B,) float32 (sigma * 1000). detach_uncond stops gradients through the
    unconditional half (Flow-GRPO training recomputes CFG with the uncond branch detached).
    guide(v_cond, v_uncond, scale): the model family's CFG form (PipelineFamily.guide); None is
    diffusers' v_u + g (v_c - v_u).
    """
    if not uses_cfg(uncond, cfg_scale):
        return velocity_fn(x, timesteps, cond).astype(jnp.float32)
    v = velocity_fn(_pairs(x, x), _pairs(timesteps, timesteps), paired_cond(cond, uncond))
    v = v.astype(jnp.float32).reshape((x.shape[0], 2) + v.shape[1:])
    v_u, v_c = v[:, 0], v[:, 1]
    if detach_uncond:
        v_u = jax.lax.stop_gradient(v_u)
    return (guide or cfg_combine)(v_c, v_u, cfg_scale)
