"""SANA's Mix-FFN (diffusers `GLUMBConv`) and SANA-Video's `GLUMBTempConv`.

GLUMBConv on a (B, H, W, D) token grid: 1x1 conv D -> 2h, SiLU, depthwise 3x3 conv (zero pad 1)
on the 2h channels, split into (x, gate), x * SiLU(gate), 1x1 conv h -> D without bias; h =
int(mlp_ratio * D). The depthwise conv is the model's only positional signal in SANA1.5.
GLUMBTempConv runs that per frame of a (B, F, H, W, D) grid and adds a dense D x D conv over the
frame axis (kernel 3, zero pad 1, no bias; sana/temporal.py, split along frames) to its output.
Kernels are stored HWIO (the converter's "conv" layout: torch OIHW moved), 1x1 ones too, so the
table needs no new transform.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from wfm_jax.models.layers.linear import param
from wfm_jax.models.sana.temporal import TemporalConv, constrain_frames


def _kernel(rngs, shape, param_dtype, axes):
    fan_in = math.prod(shape[:-1])
    return param(jax.random.normal(rngs.params(), shape, param_dtype) / math.sqrt(fan_in), axes)


class Conv1x1(nnx.Module):
    """nn.Conv2d(cin, cout, 1): a matmul over the channel axis; kernel (1, 1, cin, cout)."""

    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs, bias: bool = True, axes=(None, None),
                 dtype=None, param_dtype=jnp.float32):
        self.dtype = dtype
        self.kernel = _kernel(rngs, (1, 1, cin, cout), param_dtype, (None, None, *axes))
        self.bias = param(jnp.zeros((cout,), param_dtype), (axes[1],)) if bias else None

    def __call__(self, x):
        dtype = self.dtype or x.dtype
        y = jnp.dot(x.astype(dtype), self.kernel[...][0, 0].astype(dtype))
        return y if self.bias is None else y + self.bias[...].astype(dtype)


class DepthwiseConv3x3(nnx.Module):
    """nn.Conv2d(c, c, 3, padding=1, groups=c) on (B, H, W, c); kernel (3, 3, 1, c).

    Written as nine shifted products, not a grouped conv: XLA's SPMD partitioner gets the
    kernel gradient of a grouped conv wrong under a batch-sharded input (it comes out multiplied
    by the number of batch shards; measured with jax 0.10.2 on 8 host devices)."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
        self.channels, self.dtype = channels, dtype
        self.kernel = _kernel(rngs, (3, 3, 1, channels), param_dtype, (None, None, None, "mlp"))
        self.bias = param(jnp.zeros((channels,), param_dtype), ("mlp",))

    def __call__(self, x):
        """(..., H, W, c): any leading axes (SANA-Video keeps (B, F) apart, so a frame split
        over `context` stays where it is)."""
        dtype = self.dtype or x.dtype
        h, w = x.shape[-3:-1]
        pad = ((0, 0),) * (x.ndim - 3) + ((1, 1), (1, 1), (0, 0))
        xp = jnp.pad(x.astype(dtype), pad)
        k = self.kernel[...].astype(dtype)
        y = sum(xp[..., i:i + h, j:j + w, :] * k[i, j, 0] for i in range(3) for j in range(3))
        return y + self.bias[...].astype(dtype)


class GLUMBConv(nnx.Module):
    """(..., H, W, D) -> (..., H, W, D); diffusers GLUMBConv(D, D, mlp_ratio, norm_type=None,
    residual_connection=False), the configuration both SANA models use."""

    def __init__(self, dim: int, mlp_ratio: float, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        hidden = int(mlp_ratio * dim)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.conv_inverted = Conv1x1(dim, 2 * hidden, axes=("embed", "mlp"), **kw)
        self.conv_depth = DepthwiseConv3x3(2 * hidden, **kw)
        self.conv_point = Conv1x1(hidden, dim, bias=False, axes=("mlp", "embed"), **kw)

    def __call__(self, x):
        h = self.conv_depth(jax.nn.silu(self.conv_inverted(x)))
        h, gate = jnp.split(h, 2, axis=-1)
        return self.conv_point(h * jax.nn.silu(gate))


class GLUMBTempConv(GLUMBConv):
    """(B, F, H, W, D) -> (B, F, H, W, D): GLUMBConv per frame, plus conv_temp over frames."""

    def __init__(self, dim: int, mlp_ratio: float, *, rngs: nnx.Rngs, dtype=None,
                 param_dtype=jnp.float32):
        super().__init__(dim, mlp_ratio, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.conv_temp = TemporalConv(dim, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x):
        b, f, h, w, d = x.shape
        # frames stay split where they are: the per-frame part and the residual need no
        # neighbour, the temporal conv exchanges one halo frame each side
        x = constrain_frames(x)
        y = constrain_frames(super().__call__(x).reshape(b, f, h * w, d))
        return (y + self.conv_temp(y)).reshape(b, f, h, w, d)
