"""SANA-Video split along frames over `context` (issue J item 4): the temporal conv exchanges
one halo frame each side, nothing gathers the token stream, and the 8-device forward equals one
device, including with the conv kernel's input channels over fsdp (where XLA's own partitioning
of the conv was wrong). Latent frames that do not divide the split fall back, with a warning, to
whole frames on every shard."""
from __future__ import annotations

import contextlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.core.mesh import make_mesh, param_shardings
from wfm_jax.models.sana import SanaVideoTransformer
from wfm_jax.models.sana.temporal import conv_frames, temporal_conv

pytestmark = [
    pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices"),
    pytest.mark.compile_bound,  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)
]

CONFIG = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12,
              num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=12,
              cross_attention_dim=24, caption_channels=16, mlp_ratio=3.0, sample_size=4,
              patch_size=(1, 2, 2), qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
BATCH, LATENT_HW = 4, (8, 6)  # grid 4 x 3 = 12 tokens a frame
GATHER = re.compile(r"= [a-z0-9]+\[([0-9,]*)\]\S* all-gather(?:-start)?\(")
FALLBACK = "do not split over context=2"


def _mesh():
    return make_mesh(data=2, fsdp=2, context=2)


@pytest.mark.parametrize("frames", [4, 3])
def test_temporal_conv_split_along_frames_equals_unsplit(frames):
    """Values and gradients (input and kernel) with frames over context and the kernel's input
    channels over fsdp: 4 frames exchange halos (two ppermutes), 3 fall back and say so."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, frames, 6, 24)).astype(np.float32)
    k = rng.standard_normal((3, 1, 24, 24)).astype(np.float32)
    loss = lambda conv: lambda x, k: jnp.sum(jnp.sin(conv(x, k)))
    want = (np.asarray(conv_frames(x, k)), jax.grad(loss(conv_frames), argnums=(0, 1))(x, k))
    mesh = _mesh()
    xs = jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None)))
    ks = jax.device_put(k, NamedSharding(mesh, P(None, None, "fsdp")))
    with jax.set_mesh(mesh), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = np.asarray(jax.jit(temporal_conv)(xs, ks))
        grads = jax.jit(jax.grad(loss(temporal_conv), argnums=(0, 1)))(xs, ks)
        jaxpr = str(jax.make_jaxpr(temporal_conv)(xs, ks))
    np.testing.assert_allclose(got, want[0], atol=2e-5, rtol=1e-5)
    for a, b in zip(grads, want[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)
    warned = any(FALLBACK in str(w.message) for w in caught)
    assert warned == (frames % 2 == 1)
    assert jaxpr.count("ppermute") == (0 if warned else 2)


def _gathered_token_streams(hlo: str, tokens: int) -> list[str]:
    """all-gather results that hold a whole token stream of one batch shard (any layout: the
    leading dims multiply to B/4 x tokens, whatever the channel count)."""
    rows = BATCH // 4 * tokens
    out = []
    for dims in GATHER.findall(hlo):
        shape = [int(d) for d in dims.split(",") if d]
        if len(shape) >= 2 and int(np.prod(shape[:-1])) == rows:
            out.append(dims)
    return out


@pytest.mark.parametrize("frames", [4, 3])
def test_sharded_forward_is_frame_aligned_and_equals_one_device(frames):
    """The compiled 8-device forward (data=2 x fsdp=2 x context=2, weights on their shards) of
    4 latent frames gathers no token stream (the FFN included): its only exchange of video
    activations is the one-frame halo. 3 frames fall back to gathering, which the same HLO
    check sees. Both equal one device."""
    model = SanaVideoTransformer(CONFIG, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    args = (rng.standard_normal((BATCH, 4, frames, *LATENT_HW)).astype(np.float32),
            rng.standard_normal((BATCH, 5, 16)).astype(np.float32),
            np.array([999.0, 500.0, 20.0, 3.0], np.float32))
    graph, state = nnx.split(model)
    forward = jax.jit(lambda s, x, c, t: nnx.merge(graph, s)(
        hidden_states=x, encoder_hidden_states=c, timestep=t))
    want = np.asarray(forward(state, *args))
    mesh = _mesh()
    shardings = param_shardings(model, mesh)
    for path, var in nnx.to_flat_state(state):
        var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
    fallback = pytest.warns(UserWarning, match=FALLBACK) if frames % 2 else contextlib.nullcontext()
    with jax.set_mesh(mesh), fallback:
        compiled = forward.lower(state, *args).compile()
        got = np.asarray(compiled(state, *args))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    hlo = compiled.as_text()
    gathered = _gathered_token_streams(hlo, frames * 12)
    if frames % 2:
        assert gathered, "the fallback gathers the frames; the check must see it"
        return
    assert not gathered, gathered
    # the halo: a (B/4, 1 frame, 12 tokens, D) slice each way, in each of the 2 blocks
    halos = re.findall(r"= f32\[1,1,12,24\]\S* collective-permute(?:-start)?\(", hlo)
    assert len(halos) == 2 * CONFIG["num_layers"]
