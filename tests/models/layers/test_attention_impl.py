"""The attention kernel choice: "auto" resolves to cuDNN flash attention only where cuDNN can run
it, and every entry point (model constructor, config) accepts and checks the same names."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests import _tiny_sd3
from wfm_jax.config import recipe as cfg
from wfm_jax.config.base import ConfigError
from wfm_jax.core import mesh as wmesh
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import assign, flat_shapes
from wfm_jax.models.layers.attention import (
    BLOCKWISE_MIN_SEQ,
    Attention,
    is_cuda_platform,
    kernel_for,
    padded_attention,
    resolve_attention_impl,
    split_heads_not_sequence,
)
from wfm_jax.models.sd3.transformer import SD3Transformer

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)


@pytest.mark.parametrize("cuda, dtype, head_dim, expected", [
    (True, jnp.bfloat16, 64, "cudnn"),   # SD3 / SD3.5 on an NVIDIA GPU
    (True, jnp.float16, 128, "cudnn"),
    (True, jnp.float32, 64, "xla"),      # cuDNN flash attention has no fp32 kernel
    (True, jnp.bfloat16, 12, "xla"),     # head dim not a multiple of 8
    (True, jnp.bfloat16, 256, "xla"),    # beyond what pre-Hopper cuDNN takes
    (False, jnp.bfloat16, 64, "xla"),    # CPU, ROCm
])
def test_auto_resolves_to_cudnn_only_where_it_runs(cuda, dtype, head_dim, expected):
    # a short sequence: off cuDNN, XLA's kernel
    assert resolve_attention_impl("auto", dtype, head_dim, seq_len=1357, cuda=cuda,
                                  tpu=False) == expected


def test_auto_off_gpu_and_tpu_goes_blockwise_from_the_threshold():
    def auto(seq_len):
        return resolve_attention_impl("auto", jnp.float32, 64, seq_len=seq_len, cuda=False,
                                      tpu=False)
    assert auto(BLOCKWISE_MIN_SEQ - 1) == "xla"
    assert auto(BLOCKWISE_MIN_SEQ) == "blockwise"
    assert auto(None) == "auto"  # a module, before it sees a sequence: decided per call
    # cuDNN where it runs, whatever the length; Pallas on TPU
    assert resolve_attention_impl("auto", jnp.bfloat16, 64, seq_len=75600, cuda=True) == "cudnn"
    assert resolve_attention_impl("auto", jnp.float32, 64, cuda=False, tpu=True) == "pallas"
    assert kernel_for("auto", jnp.zeros((1, 8, 2, 64)), BLOCKWISE_MIN_SEQ) == "blockwise"
    assert kernel_for(None, jnp.zeros((1, 8, 2, 64)), BLOCKWISE_MIN_SEQ) == "xla"


def test_explicit_choices_pass_through_and_bad_ones_fail():
    for impl in ("xla", "cudnn", "blockwise", "pallas", None):
        assert resolve_attention_impl(impl, jnp.bfloat16, 64, cuda=False) == impl
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        resolve_attention_impl("flash", jnp.bfloat16, 64)
    with pytest.raises(ValueError, match="needs a bf16/fp16 compute dtype"):
        resolve_attention_impl("cudnn", jnp.float32, 64)


def test_model_built_with_auto_runs_xla_on_this_cpu():
    assert not is_cuda_platform()
    model = abstract_module(lambda: SD3Transformer(_tiny_sd3.CONFIG, dtype=jnp.bfloat16,
                                                  rngs=nnx.Rngs(0), attention_impl="auto"))
    layers = [m for _, m in model.iter_modules() if isinstance(m, Attention)]
    assert len(layers) == 3  # two joint blocks + block 0's second (MMDiT-X) attention
    # resolved per call by the sequence length: XLA for the tiny model's few tokens
    assert {layer.attention_impl for layer in layers} == {"auto"}
    assert kernel_for("auto", jnp.zeros((1, 24, 4, 8), jnp.bfloat16), 30) == "xla"


def test_config_default_is_auto_and_choices_are_checked(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("def get_config():\n    return {}\n")
    assert cfg.load_config(str(recipe)).policy.attention_impl == "auto"
    with pytest.raises(ConfigError, match=r"'policy.attention_impl' = 'cudn'.*did you mean 'cudnn'"):
        cfg.load_config(str(recipe), [("policy.attention_impl", "cudn")])
    assert cfg.load_config(str(recipe), [("policy.attention_impl", "blockwise")])
    assert cfg.load_config(str(recipe)).policy.context_parallel_impl == "auto"
    with pytest.raises(ConfigError, match=r"'policy.context_parallel_impl' = 'rin'.*did you "
                                          r"mean 'ring'"):
        cfg.load_config(str(recipe), [("policy.context_parallel_impl", "rin")])


# ------------------------------------------------------------ cuDNN under context parallelism
# cuDNN's partitioner refuses q/k/v split along the sequence; the cudnn path moves the split onto
# the heads. No GPU here: the layout is checked directly, and the model's cudnn path runs with
# the XLA kernel standing in for cuDNN (same maths, so only the plumbing is under test).

def _cp_mesh():
    return wmesh.make_mesh(data=2, fsdp=2, context=2)


def test_cudnn_layout_moves_the_sequence_split_onto_heads():
    m = _cp_mesh()
    x = np.random.default_rng(0).standard_normal((4, 16, 4, 8)).astype(np.float32)
    with jax.set_mesh(m):
        x = jax.device_put(x, NamedSharding(m, P(("data", "fsdp"), "context", None, None)))
        f = jax.jit(split_heads_not_sequence)
        y = f(x)
        hlo = f.lower(x).compile().as_text()
    assert y.sharding.is_equivalent_to(NamedSharding(m, P(("data", "fsdp"), None, "context", None)), 4)
    assert "all-to-all" in hlo  # a re-split, not a gather of the whole sequence
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_cudnn_layout_needs_heads_divisible_by_the_context_split():
    with jax.set_mesh(_cp_mesh()):
        with pytest.raises(ValueError, match="the 3 attention heads must divide by 2"):
            jax.jit(split_heads_not_sequence)(jnp.zeros((4, 16, 3, 8)))


def test_model_cudnn_path_under_context_parallelism_matches_xla(monkeypatch):
    kernels = []
    xla_attention = jax.nn.dot_product_attention

    def stand_in(q, k, v, *, implementation=None, **lengths):
        kernels.append(implementation)
        return xla_attention(q, k, v, implementation="xla", **lengths)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    x, ctx, pooled, t = _tiny_sd3.inputs(batch=4)
    outs = {}
    for impl in ("xla", "cudnn"):
        model = SD3Transformer(_tiny_sd3.CONFIG, dtype=jnp.bfloat16, rngs=nnx.Rngs(0),
                               attention_impl=impl)
        rng = np.random.default_rng(1)  # redraw everything: the zero-init adaLN hides mistakes
        assign(model, {k: 0.05 * rng.standard_normal(v).astype(np.float32)
                       for k, v in sorted(flat_shapes(model).items())})
        with jax.set_mesh(_cp_mesh()):
            outs[impl] = np.asarray(jax.jit(lambda *a: model(*a))(x, ctx, pooled, t), np.float32)
    assert set(kernels) == {"xla", "cudnn"}
    # same bf16 maths on differently split arrays (bit-equal on this CPU); allow one bf16 ulp at
    # the output's scale (~1) should another XLA order the sums differently
    np.testing.assert_allclose(outs["cudnn"], outs["xla"], atol=8e-3, rtol=0)


@pytest.mark.parametrize("t,s", [(21, 21), (13, 40), (64, 64)])
def test_padded_attention_matches_the_unpadded_call_with_gradients(t, s):
    # the cuDNN path pads the joint sequence to CUDNN_SEQ_MULTIPLE with a key padding mask; the
    # XLA kernel takes the same lengths, so the padding itself is checked here in fp32
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, t, 3, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, s, 3, 8)), jnp.float32) for _ in range(2))
    w = jnp.asarray(rng.standard_normal((2, t, 3, 8)), jnp.float32)

    def loss(fn):
        return jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), argnums=(0, 1, 2))

    plain = loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"))
    padded = loss(lambda q, k, v: padded_attention(q, k, v, implementation="xla", multiple=16))
    (a, ga), (b, gb) = plain(q, k, v), padded(q, k, v)
    np.testing.assert_allclose(b, a, rtol=1e-5)
    for x, y in zip(gb, ga):
        np.testing.assert_allclose(x, y, atol=2e-5)
