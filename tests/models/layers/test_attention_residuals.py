"""The *_attention_saveable remat policies: a flash kernel's residuals kept, so the backward
never reruns its forward (layers/remat.py keep_residuals); values and gradients unchanged."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wfm_jax.models.layers.context_parallel import local_kernel
from wfm_jax.models.layers.remat import REMAT_POLICIES, check_remat, checkpointed, keep_residuals
from wfm_jax.programs.stats import count_jaxpr_flops

B, T, N, H, D = 2, 64, 2, 8, 16


def _block(kernel):
    """A block as the transformers build one: projections, a flash kernel, an output projection."""
    def block(w, x):
        q, k, v = (jnp.einsum("btd,dnh->btnh", x, w[i]) for i in range(3))
        return jnp.einsum("btnh,nhd->btd", kernel(q, k, v), w[3].transpose(1, 2, 0))
    return block


def _inputs(seed=0):
    r = np.random.default_rng(seed)
    w = jnp.asarray(r.normal(0, 0.3, (4, D, N, H)), jnp.float32)
    return w, jnp.asarray(r.normal(0, 1, (B, T, D)), jnp.float32)


def _blockwise(q, k, v):
    return local_kernel("blockwise")(q, k, v, None)


def _grad(remat, kernel):
    fn = checkpointed(_block(keep_residuals(kernel)), remat)
    return jax.value_and_grad(lambda w, x: jnp.sum(fn(w, x) ** 2), argnums=(0, 1))


def test_keep_residuals_changes_no_value_or_gradient():
    w, x = _inputs()
    plain = jax.value_and_grad(lambda w, x: jnp.sum(_block(_blockwise)(w, x) ** 2),
                               argnums=(0, 1))(w, x)
    for remat in ("everything_saveable", "nothing_saveable", "attention_saveable",
                  "dots_with_no_batch_dims_and_attention_saveable"):
        got = _grad(remat, _blockwise)(w, x)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(plain), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5,
                                       err_msg=remat)


@pytest.mark.parametrize("remat", ["attention_saveable",
                                   "dots_with_no_batch_dims_and_attention_saveable"])
def test_attention_saveable_runs_the_kernel_forward_once(remat):
    """Matmul FLOPs of the whole value-and-grad: with the residuals kept it is exactly the
    program without remat; under nothing_saveable the kernel's forward (and the projections)
    run again, 4·B·T·T·N·H more at least."""
    w, x = _inputs()

    def flops(r):
        return count_jaxpr_flops(jax.make_jaxpr(_grad(r, _blockwise))(w, x))
    attention_forward = 4.0 * B * T * T * N * H
    assert flops(remat) == flops("everything_saveable")
    assert flops("nothing_saveable") - flops(remat) >= attention_forward


def test_attention_policies_are_named_and_compose_jax_policies():
    assert check_remat("attention_saveable") == "attention_saveable"
    both = REMAT_POLICIES["dots_with_no_batch_dims_and_attention_saveable"]
    assert both is not REMAT_POLICIES["attention_saveable"] and callable(both)


def test_other_policies_trace_the_kernel_untouched():
    """keep_residuals wraps the kernel only inside a block traced under an attention policy:
    every other run's program is what it was."""
    w, x = _inputs()

    def wrapped(remat):
        text = str(jax.make_jaxpr(_grad(remat, _blockwise))(w, x))
        return "attention_residuals" in text  # the checkpoint name keep_residuals tags
    assert wrapped("attention_saveable")
    assert not any(wrapped(r) for r in ("everything_saveable", "nothing_saveable",
                                        "dots_with_no_batch_dims_saveable"))
