"""SANA-Video's temporal conv (diffusers `GLUMBTempConv.conv_temp`) with the video split along
frames over `context`.

nn.Conv2d(D, D, (3, 1), padding=(1, 0), bias=False) over (B, F, P, D) (frames, pixels): each
output frame reads its two neighbours. Under a mesh whose rules split the tokens (act_seq), the
frames are split over those axes (the token split then falls on frame boundaries), and the conv
runs in shard_map: every shard receives one halo frame from each neighbour (two ppermutes of a
(B, 1, P, D) slice; the first and last shard receive zeros, which is the conv's zero padding)
and convolves locally. Nothing else crosses devices: no gather of the token stream.

It is not left to XLA's SPMD partitioner: with the frames split over one mesh axis and the
kernel's input channels over another (fsdp), XLA (jax 0.10.2, CPU) returns a wrong conv, wrong
by O(1) on random inputs; halo exchange alone or fsdp alone are right. Here the kernel enters
shard_map whole, as FSDP gathers any weight before use.

When the latent frames do not divide the frame shards, the frames stay whole on each shard (the
tokens are gathered over `context` for the conv): a warning says so when it is traced.
"""
from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from wfm_jax.core import mesh
from wfm_jax.models.layers.linear import param

_NHWC = ("NHWC", "HWIO", "NHWC")


def _axes_over(rules: dict, name: str, m) -> tuple[str, ...]:
    return tuple(a for a in mesh.mesh_axes_of(rules.get(name)) if m.shape[a] > 1)


def frame_split(batch: int, frames: int):
    """(batch axes, frame axes) that shard a (B, F, P, D) video under the active mesh and rules;
    None without a mesh. Batch axes are () when the batch does not divide them; frame axes ()
    when the tokens are not split or the frames do not divide the split (warned: the fallback
    gathers the frames)."""
    m = jax.sharding.get_abstract_mesh()
    if m is None or m.empty:
        return None
    rules = dict(mesh.active_rules())
    batch_axes = _axes_over(rules, "act_batch", m)
    if batch % math.prod(m.shape[a] for a in batch_axes):
        batch_axes = ()
    frame_axes = _axes_over(rules, "act_seq", m)
    shards = math.prod(m.shape[a] for a in frame_axes)
    if frames % shards:
        _warn_gather(frames, frame_axes, shards)
        frame_axes = ()
    return batch_axes, frame_axes


def _warn_gather(frames: int, axes: tuple, shards: int) -> None:
    warnings.warn(f"SANA-Video: {frames} latent frames do not split over {'x'.join(axes)}="
                  f"{shards}; the temporal conv gathers the frames on every shard (choose a "
                  f"frame count whose latent frames divide {shards} to split along frames)",
                  stacklevel=2)


def _spec(split, ndim: int) -> P:
    batch_axes, frame_axes = split
    return P(batch_axes or None, frame_axes or None, *(None,) * (ndim - 2))


def constrain_frames(x):
    """Lay a (B, F, ...) video out frame-aligned: batch over act_batch, frames over act_seq.
    A no-op without a mesh or when the frames do not divide (the rest of the FFN then stays
    as GSPMD lays it out; only the temporal conv gathers)."""
    split = frame_split(x.shape[0], x.shape[1])
    if split is None or not split[1]:
        return x
    return jax.lax.with_sharding_constraint(x, _spec(split, x.ndim))


def conv_frames(x, kernel, padding: int = 1):
    """The (3, 1) conv over axis 1 of (B, F, P, D), `padding` zero frames each side."""
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), ((padding, padding), (0, 0)),
                                        dimension_numbers=_NHWC)


def _halo_conv(x, kernel, *, frame_axes):
    """One shard's frames with a frame from each neighbouring shard (zeros past the ends)."""
    n = math.prod(jax.lax.axis_size(a) for a in frame_axes)
    left = jax.lax.ppermute(x[:, -1:], frame_axes, [(i, i + 1) for i in range(n - 1)])
    right = jax.lax.ppermute(x[:, :1], frame_axes, [(i + 1, i) for i in range(n - 1)])
    return conv_frames(jnp.concatenate([left, x, right], axis=1), kernel, padding=0)


def temporal_conv(x, kernel):
    """(B, F, P, D) conv over frames, split along frames under a mesh (see the module doc)."""
    split = frame_split(x.shape[0], x.shape[1])
    if split is None:
        return conv_frames(x, kernel)
    spec, frame_axes = _spec(split, x.ndim), split[1]
    local = (functools.partial(_halo_conv, frame_axes=frame_axes) if frame_axes
             else conv_frames)
    return jax.shard_map(local, in_specs=(spec, P()), out_specs=spec)(x, kernel)


class TemporalConv(nnx.Module):
    """nn.Conv2d(D, D, (3, 1), padding=(1, 0), bias=False) over (B, F, P, D); kernel
    (3, 1, D, D) HWIO, the frames as "H"."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.dtype = dtype
        init = jax.random.normal(rngs.params(), (3, 1, dim, dim), param_dtype) / math.sqrt(3 * dim)
        self.kernel = param(init, (None, None, "embed", None))

    def __call__(self, x):
        dtype = self.dtype or x.dtype
        return temporal_conv(x.astype(dtype), self.kernel[...].astype(dtype))
