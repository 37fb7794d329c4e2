"""The attention kernel choice: "auto" resolves to cuDNN flash attention only where cuDNN can run
it, and every entry point (model constructor, config) accepts and checks the same names."""
from __future__ import annotations

import jax.numpy as jnp
import pytest
from flax import nnx

from tests import _tiny_sd3
from wfm_jax import config as cfg
from wfm_jax.config_schema import ConfigError
from wfm_jax.models.layers.attention import (Attention, is_cuda_platform,
                                             resolve_attention_impl)
from wfm_jax.models.sd3.transformer import SD3Transformer


@pytest.mark.parametrize("cuda, dtype, head_dim, expected", [
    (True, jnp.bfloat16, 64, "cudnn"),   # SD3 / SD3.5 on an NVIDIA GPU
    (True, jnp.float16, 128, "cudnn"),
    (True, jnp.float32, 64, "xla"),      # cuDNN flash attention has no fp32 kernel
    (True, jnp.bfloat16, 12, "xla"),     # head dim not a multiple of 8
    (True, jnp.bfloat16, 256, "xla"),    # beyond what pre-Hopper cuDNN takes
    (False, jnp.bfloat16, 64, "xla"),    # CPU, TPU, ROCm
])
def test_auto_resolves_to_cudnn_only_where_it_runs(cuda, dtype, head_dim, expected):
    assert resolve_attention_impl("auto", dtype, head_dim, cuda=cuda) == expected


def test_explicit_choices_pass_through_and_bad_ones_fail():
    for impl in ("xla", "cudnn", None):
        assert resolve_attention_impl(impl, jnp.bfloat16, 64, cuda=False) == impl
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        resolve_attention_impl("flash", jnp.bfloat16, 64)
    with pytest.raises(ValueError, match="needs a bf16/fp16 compute dtype"):
        resolve_attention_impl("cudnn", jnp.float32, 64)


def test_model_built_with_auto_runs_xla_on_this_cpu():
    assert not is_cuda_platform()
    model = nnx.eval_shape(lambda: SD3Transformer(_tiny_sd3.CONFIG, dtype=jnp.bfloat16,
                                                  rngs=nnx.Rngs(0), attention_impl="auto"))
    layers = [m for _, m in model.iter_modules() if isinstance(m, Attention)]
    assert len(layers) == 3  # two joint blocks + block 0's second (MMDiT-X) attention
    assert {layer.attention_impl for layer in layers} == {"xla"}


def test_config_default_is_auto_and_choices_are_checked(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("def get_config():\n    return {}\n")
    assert cfg.load_config(str(recipe)).policy.attention_impl == "auto"
    with pytest.raises(ConfigError, match=r"'policy.attention_impl' = 'cudn'.*did you mean 'cudnn'"):
        cfg.load_config(str(recipe), [("policy.attention_impl", "cudn")])
