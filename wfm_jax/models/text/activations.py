"""transformers activation names (config `hidden_act` / `dense_act_fn`) -> JAX functions."""
from __future__ import annotations

from collections.abc import Callable

import jax


def _quick_gelu(x: jax.Array) -> jax.Array:  # OpenAI CLIP's sigmoid approximation
    return x * jax.nn.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "quick_gelu": _quick_gelu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),  # tanh form
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; "
                         f"supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


__all__ = ["ACTIVATIONS", "activation"]
