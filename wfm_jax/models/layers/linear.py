"""Dense layer with logical sharding names and an optional LoRA branch.

Parameters are created with `out_sharding=<logical axis names>` and `eager_sharding=False`: the
model never places itself on devices; `wfm_jax.core.mesh` maps the logical names to mesh axes and the
loaders put each tensor straight into its shards.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

Axes = tuple  # logical axis names, one per dimension (None = replicated)


def param(value, axes: Axes, kind=nnx.Param):
    return kind(value, out_sharding=tuple(axes), eager_sharding=False)


class Linear(nnx.Module):
    """y = x @ kernel + bias (+ (x @ lora_a @ lora_b) * lora_scale when LoRA is attached).

    kernel is (in, out) — the transpose of torch's Linear.weight. `dtype` is the compute dtype;
    parameters stay in `param_dtype` (fp32 master weights) and are cast at use.
    """

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs, bias: bool = True,
                 axes: Axes = (None, None), dtype=None, param_dtype=jnp.float32):
        self.in_features, self.out_features = in_features, out_features
        self.dtype = dtype
        self.axes = tuple(axes)
        init = nnx.initializers.lecun_normal()
        self.kernel = param(init(rngs.params(), (in_features, out_features), param_dtype), axes)
        self.bias = param(jnp.zeros((out_features,), param_dtype), (axes[1],)) if bias else None
        self.lora_a = nnx.data(None)  # filled by add_lora
        self.lora_b = nnx.data(None)
        self.lora_scale = 0.0

    def add_lora(self, rank: int, alpha: float, rngs: nnx.Rngs, dtype=jnp.float32) -> None:
        """Attach LoRA as peft's `init_lora_weights="gaussian"` does: A ~ N(0, 1/rank), B = 0."""
        a = jax.random.normal(rngs.params(), (self.in_features, rank), dtype) / rank
        self.lora_a = param(a, (self.axes[0], None), nnx.LoRAParam)
        self.lora_b = param(jnp.zeros((rank, self.out_features), dtype), (None, self.axes[1]),
                            nnx.LoRAParam)
        self.lora_scale = float(alpha) / float(rank)

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        y = jnp.dot(x, self.kernel[...].astype(dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        if self.lora_a is not None:
            low = jnp.dot(x, self.lora_a[...].astype(dtype))
            y = y + jnp.dot(low, self.lora_b[...].astype(dtype)) * jnp.asarray(self.lora_scale, dtype)
        return y

    def einsum(self, spec: str, x: jax.Array, kernel_shape: tuple, bias_shape: tuple | None = None
               ) -> jax.Array:
        """x through this layer's weights written in another layout: the kernel reshaped to
        `kernel_shape` and contracted with x by the einsum `spec`, the bias reshaped to
        `bias_shape` (e.g. a projection straight into attention's heads-first layout,
        layers/attention.py). The kernel's leading dims of `kernel_shape` split its input
        features, the rest its output features. Same dtypes and LoRA branch as __call__."""
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        kernel = self.kernel[...].astype(dtype).reshape(kernel_shape)
        y = jnp.einsum(spec, x, kernel)
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype).reshape(bias_shape or self.bias.shape)
        if self.lora_a is not None:
            n_in = _input_dims(kernel.shape, self.in_features)
            low_spec, up_spec = _lora_specs(spec, n_in)
            a = self.lora_a[...].astype(dtype).reshape(*kernel.shape[:n_in], -1)
            b = self.lora_b[...].astype(dtype)
            b = b.reshape(b.shape[0], *kernel.shape[n_in:])
            low = jnp.einsum(low_spec, x, a)
            y = y + jnp.einsum(up_spec, low, b) * jnp.asarray(self.lora_scale, dtype)
        return y


def _input_dims(kernel_shape: tuple, in_features: int) -> int:
    """How many leading dims of a reshaped kernel make up its input features."""
    size = 1
    for i, d in enumerate(kernel_shape):
        size *= d
        if size == in_features:
            return i + 1
    raise ValueError(f"kernel shape {kernel_shape} does not start with {in_features} input features")


def _lora_specs(spec: str, input_dims: int) -> tuple[str, str]:
    """The two einsums of the LoRA branch of `spec` ("x,kernel->y"), whose kernel's first
    `input_dims` letters are the input features: x with A (the input letters, then the rank) to
    the low-rank activations, then those with B (the rank, then the output letters) to y."""
    inputs, out = spec.replace(" ", "").split("->")
    x, kernel = inputs.split(",")
    rank = next(c for c in "rzyxwvuqpo" if c not in spec)
    k_in, k_out = kernel[:input_dims], kernel[input_dims:]
    low = "".join(c for c in out if c not in k_out) + rank
    return f"{x},{k_in}{rank}->{low}", f"{low},{rank}{k_out}->{out}"
