"""Multi-head attention as diffusers' `Attention` + `JointAttnProcessor2_0` compute it.

`Attention` holds the projections under diffusers' module names (to_q, to_k, to_v, to_out.0, and
for joint attention add_q_proj, add_k_proj, add_v_proj, to_add_out), so LoRA target names such as
"attn.to_q" address the same layers in both frameworks. The kernel is selectable
(`attention_impl`):
  "xla"       jax.nn.dot_product_attention on XLA (keeps the [B, N, T, S] softmax for backward);
  "cudnn"     cuDNN flash attention (NVIDIA GPUs, bf16/fp16);
  "blockwise" flash-style online softmax in plain JAX, any backend (blockwise_attention);
  "pallas"    the Pallas TPU flash kernel (pallas_attention);
  "auto"      cuDNN on a CUDA GPU where it applies, Pallas on TPU, else by sequence length:
              XLA below BLOCKWISE_MIN_SEQ tokens, blockwise from there (resolve_attention_impl);
              the platform is that of the mesh the call is compiled for (target_device), so a
              CPU process compiling for a TPU topology mesh gets Pallas, as a TPU run would;
  None        JAX's own default (XLA in jax 0.10).
With the sequence split over the mesh (`context`), `context_parallel_impl` picks Ulysses or ring
attention (context_parallel); cuDNN keeps its own Ulysses layout (split_heads_not_sequence).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from wfm_jax.core import mesh
from wfm_jax.models.layers import context_parallel as cp
from wfm_jax.models.layers.context_parallel import CONTEXT_PARALLEL_IMPLS as CONTEXT_PARALLEL_IMPLS
from wfm_jax.models.layers.context_parallel import check_context_parallel_impl
from wfm_jax.models.layers.linear import Linear
from wfm_jax.models.layers.norms import LayerNorm, RMSNorm
from wfm_jax.models.layers.pallas_attention import pallas_tpu_available
from wfm_jax.models.layers.remat import keep_residuals

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "blockwise", "pallas", None)
QKV_AXES = ("act_batch", "act_seq", "act_heads", None)
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
# cuDNN flash attention takes head dims that are multiples of 8 up to 128 (256 from Hopper on;
# the lower bound keeps "auto" safe on every NVIDIA generation).
CUDNN_MAX_HEAD_DIM = 128
# cuDNN's training kernels in jax 0.11.2 refused SD3's joint sequence at 512 px (1024 image + 333
# text tokens: "Unsupported sequence length Q 1357, KV 1357") on an H100; padded to a multiple of
# 64 with a key padding mask they run (measured 2026-11-22, docs/bench_notes.md).
CUDNN_SEQ_MULTIPLE = 64
# "auto" off CUDA/TPU: from this many tokens (the longer of queries and keys) the blockwise kernel
# runs instead of XLA's. XLA's path saves B*N*S*S floats per layer for the backward: at 2048
# tokens that is 16 MiB per head and sample (SD3.5-M at 1024 px: 4429 tokens, 75 MiB); below it
# the S x S buffer is small and XLA's fused kernel is faster than the sequential block loops.
BLOCKWISE_MIN_SEQ = 2048


def check_attention_impl(impl, compute_dtype) -> None:
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if impl == "cudnn" and jnp.dtype(compute_dtype) not in CUDNN_DTYPES:
        raise ValueError(f"attention_impl='cudnn' needs a bf16/fp16 compute dtype, got {compute_dtype}")


def target_device(mesh=None):
    """The device attention is compiled for: the first of `mesh`'s devices, else of the mesh in
    context (jax.set_mesh, also inside jit and shard_map), else jax.devices()[0].

    The mesh, not jax.devices(), is the compile target: a process planning for a TPU topology
    (jax.experimental.topologies) has only CPU devices of its own. Returns a jax Device or, for
    an abstract mesh, its AbstractDevice (platform and device_kind, no client)."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh.devices.flat[0]
    if mesh is not None and not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device
    return jax.devices()[0]


def is_cuda_platform(device=None, *, mesh=None) -> bool:
    """True when compiling for an NVIDIA (CUDA) GPU (target_device); ROCm GPUs and CPU/TPU have
    no cuDNN. (A GPU that does not say which is taken for CUDA, the common case.)"""
    device = device or target_device(mesh)
    if device.platform != "gpu":
        return False
    client = getattr(device, "client", None)
    if client is not None:
        return "rocm" not in str(getattr(client, "platform_version", "")).lower()
    return not str(getattr(device, "device_kind", "")).lower().startswith("amd")


def is_tpu_platform(device=None, *, mesh=None) -> bool:
    return (device or target_device(mesh)).platform == "tpu"


def resolve_attention_impl(impl, compute_dtype, head_dim: int, *, seq_len: int | None = None,
                           cuda: bool | None = None, tpu: bool | None = None, mesh=None):
    """The implementation "auto" stands for: "cudnn" on a CUDA GPU with a bf16/fp16 compute dtype
    and a head dim cuDNN takes; "pallas" on TPU; otherwise "blockwise" when seq_len >=
    BLOCKWISE_MIN_SEQ, "xla" below. Other values pass through unchanged.

    The platform is the compile target's: `cuda` / `tpu` when given, else `mesh`'s devices, else
    the mesh in context (target_device). Without seq_len and without a target given (a module
    being built, which may later be traced for another mesh) it returns "auto" itself: decided
    per call (kernel_for), under the mesh the call is compiled for.

    Why not JAX's None: it picks XLA, whose attention keeps every (S x S) softmax for the
    backward. For SD3.5-Medium at 512 px that is about 3.8 GB per attention layer and batch of
    4, which does not fit an 80 GB GPU across 37 attention layers; flash attention keeps none.
    """
    check_attention_impl(impl, compute_dtype)
    if impl != "auto":
        return impl
    if seq_len is None and cuda is None and tpu is None and mesh is None:
        return "auto"
    cuda = is_cuda_platform(mesh=mesh) if cuda is None else cuda
    fits = head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM
    if cuda and fits and jnp.dtype(compute_dtype) in CUDNN_DTYPES:
        return "cudnn"
    tpu = is_tpu_platform(mesh=mesh) if tpu is None else tpu
    if tpu and pallas_tpu_available():
        return "pallas"
    if seq_len is None:
        return "auto"
    return "blockwise" if seq_len >= BLOCKWISE_MIN_SEQ else "xla"


def kernel_for(impl, q, seq_len: int) -> str:
    """The kernel one call runs: `impl` resolved for queries like q (B, T, N, H) and the longer
    of the query and key sequences, seq_len."""
    if impl is None:
        return "xla"
    if impl == "auto":
        return resolve_attention_impl("auto", q.dtype, q.shape[-1], seq_len=seq_len)
    return impl


def split_heads_not_sequence(x: jax.Array) -> jax.Array:
    """(B, T, N, H) laid out for cuDNN under context parallelism: cuDNN's partitioner refuses q/k/v
    split along the sequence, so the sequence split moves onto the heads (one all-to-all, as
    Ulysses context parallelism does, instead of gathering every key and value). Without a mesh,
    or with the sequence unsplit, it is the usual QKV_AXES constraint."""
    m = jax.sharding.get_abstract_mesh()
    if m is None or m.empty:
        return x
    rules = dict(mesh.active_rules())
    seq = tuple(a for a in mesh.mesh_axes_of(rules.get("act_seq")) if m.shape[a] > 1)
    if not seq:
        return mesh.constrain(x, QKV_AXES)
    heads = mesh.mesh_axes_of(rules.get("act_heads")) + seq
    n = math.prod(m.shape[a] for a in heads)
    if x.shape[2] % n:
        layout = " x ".join(f"{a}={m.shape[a]}" for a in heads)
        raise ValueError(f"attention_impl='cudnn' with the sequence split over {layout}: the "
                         f"{x.shape[2]} attention heads must divide by {n}; use "
                         "attention_impl='xla' or another context size")
    spec = P(rules.get("act_batch"), None, heads, None)
    return jax.lax.with_sharding_constraint(x, spec)


def padded_attention(q, k, v, *, implementation, multiple: int):
    """`jax.nn.dot_product_attention` with the sequences padded to a multiple of `multiple`.

    The padded keys are masked by `key_value_seq_lengths`; padded query rows attend to the real
    keys and are sliced off, so the result (and its gradient) is that of the unpadded call. Query
    lengths are left unset on purpose: a fully masked query row is a 0/0 softmax on the XLA path.
    """
    t, s = q.shape[1], k.shape[1]
    pad_t, pad_s = -t % multiple, -s % multiple
    if not pad_t and not pad_s:
        return jax.nn.dot_product_attention(q, k, v, implementation=implementation)

    def pad(x, n):
        return jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0))) if n else x

    lengths = jnp.full((q.shape[0],), s, jnp.int32)
    out = jax.nn.dot_product_attention(pad(q, pad_t), pad(k, pad_s), pad(v, pad_s),
                                       key_value_seq_lengths=lengths,
                                       implementation=implementation)
    return out[:, :t]


def _cudnn_kernel(q, k, v):
    return padded_attention(q, k, v, implementation="cudnn", multiple=CUDNN_SEQ_MULTIPLE)


def _cudnn_attention(q, k, v):
    q, k, v = (split_heads_not_sequence(t) for t in (q, k, v))
    # residuals tagged for the *_attention_saveable remat policies (layers/remat.py)
    out = keep_residuals(_cudnn_kernel)(q, k, v)
    return mesh.constrain(out, QKV_AXES)  # back to the sequence split the rest of the block uses


def _local_attention(q, k, v, impl):
    """One kernel with the sequence not split (a mesh may still split batch or heads)."""
    if impl == "cudnn":
        return _cudnn_attention(q, k, v)
    if impl in ("blockwise", "pallas"):
        if cp.has_mesh():
            return keep_residuals(lambda *a: cp.sharded_local_attention(*a, impl=impl))(q, k, v)
        return keep_residuals(lambda *a: cp.local_kernel(impl)(*a, None))(q, k, v)
    q, k, v = (mesh.constrain(t, QKV_AXES) for t in (q, k, v))
    out = jax.nn.dot_product_attention(q, k, v, implementation=impl)
    return mesh.constrain(out, QKV_AXES)


def dot_product_attention(q, k, v, *, implementation="xla", context_parallel="auto"):
    """Softmax attention over (B, T, N, H) arrays, scale 1/sqrt(H), no mask (as SD3 uses it).

    With the sequence split over the mesh, `context_parallel` ("auto" | "ulysses" | "ring")
    picks the scheme; q, k and v are taken as split along their sequence. cuDNN keeps its own
    Ulysses layout; under the ring every kernel attends blockwise (the ring merges chunks by
    their log-sum-exp, which cuDNN and XLA do not return)."""
    impl = kernel_for(implementation, q, max(q.shape[1], k.shape[1]))
    axes = cp.sequence_axes()
    if not axes:
        return _local_attention(q, k, v, impl)
    scheme = cp.resolve_context_parallel(context_parallel, q.shape[2], axes)
    if impl == "cudnn" and scheme == "ulysses":
        return _cudnn_attention(q, k, v)
    return cp.context_parallel_attention([(q, k, v)], impl=impl, scheme=scheme, axes=axes)[0]


def cross_attention(q, k, v, *, implementation="xla", context_parallel="auto"):
    """Attention of (B, T, N, H) queries to a short (B, L, N, H) K/V (text) that every sequence
    shard holds whole: with the sequence split, each device attends its own queries (no ring,
    no all-to-all). `context_parallel` only matters for cuDNN, which keeps its Ulysses layout."""
    impl = kernel_for(implementation, q, max(q.shape[1], k.shape[1]))
    axes = cp.sequence_axes()
    if not axes or impl == "cudnn":
        return dot_product_attention(q, k, v, implementation=impl,
                                     context_parallel=context_parallel)
    if impl == "xla":  # GSPMD partitions it along the queries once K/V are replicated
        q = mesh.constrain(q, QKV_AXES)
        k, v = (mesh.constrain(t, cp.KV_REPLICATED_AXES) for t in (k, v))
        return mesh.constrain(jax.nn.dot_product_attention(q, k, v, implementation="xla"),
                              QKV_AXES)
    return cp.local_queries_attention(q, k, v, impl=impl)


def joint_attention(sample_qkv, context_qkv, *, implementation="xla", context_parallel="auto"):
    """Attention over the concatenation [sample tokens, context tokens]; returns both parts.

    Each *_qkv is a (q, k, v) triple of (B, T, N, H) arrays; the sample tokens come first in the
    joint sequence, as in JointAttnProcessor2_0. With the sequence split over the mesh, the two
    parts stay split on their own (context_parallel.context_parallel_attention), not
    concatenated and re-split.
    """
    q = sample_qkv[0]
    impl = kernel_for(implementation, q, q.shape[1] + context_qkv[0].shape[1])
    axes = cp.sequence_axes()
    if axes:
        scheme = cp.resolve_context_parallel(context_parallel, q.shape[2], axes)
        if not (impl == "cudnn" and scheme == "ulysses"):
            out, ctx = cp.context_parallel_attention([sample_qkv, context_qkv], impl=impl,
                                                     scheme=scheme, axes=axes)
            return out, ctx
    n = q.shape[1]
    q, k, v = (jnp.concatenate([s, c], axis=1) for s, c in zip(sample_qkv, context_qkv, strict=True))
    out = dot_product_attention(q, k, v, implementation=impl, context_parallel=context_parallel)
    return out[:, :n], out[:, n:]


def runs_heads_first(impl, dtype, heads: int, head_dim: int, seq_len: int) -> bool:
    """True when a call runs the Pallas kernel with the sequence unsplit: then a model can keep
    attention in the kernel's (B, N, T, H) layout from its projections (into_heads) to its output
    projection (from_heads) and save the transposes pallas_tpu_attention makes around the
    kernel. On v5p, SD3.5-M's 16-row SFT step: 0.496 -> 0.441 s estimated, peak 86.2 -> 77.8 GB
    (docs/tpu_tuning.md). `seq_len`: the longer of the query and key sequences."""
    if cp.sequence_axes():
        return False
    probe = jax.ShapeDtypeStruct((1, 1, heads, head_dim), dtype)
    return kernel_for(impl, probe, seq_len) == "pallas"


def into_heads(lin: Linear, x, heads: int, head_dim: int):
    """(B, T, D) through `lin` into (B, N, T, H): the projection writes the kernel's layout
    (LoRA included, Linear.einsum)."""
    return lin.einsum("btd,dnh->bnth", x, (x.shape[-1], heads, head_dim), (heads, 1, head_dim))


def from_heads(lin: Linear, y, heads: int, head_dim: int):
    """(B, N, T, H) through the output projection `lin` into (B, T, D)."""
    return lin.einsum("bnth,nhd->btd", y, (heads, head_dim, -1))


def heads_first_kernel(q, k, v):
    """The Pallas kernel on (B, N, T, H) q and (B, N, S, H) k, v: under a mesh inside shard_map
    over the batch and heads (context_parallel.sharded_heads_first_attention)."""
    if cp.has_mesh():
        return cp.sharded_heads_first_attention(q, k, v)
    from wfm_jax.models.layers.pallas_attention import heads_first_attention
    return heads_first_attention(q, k, v)


def make_qk_norm(kind: str | None, head_dim: int, *, eps: float, param_dtype):
    """diffusers Attention's per-head q/k norm for the kinds SD3-style blocks use."""
    if kind is None:
        return None
    if kind == "rms_norm":
        return RMSNorm(head_dim, eps=eps, param_dtype=param_dtype)
    if kind == "layer_norm":
        return LayerNorm(head_dim, eps=eps, param_dtype=param_dtype, axes=(None,))
    if kind == "fp32_layer_norm":
        return LayerNorm(head_dim, eps=eps, affine=False, param_dtype=param_dtype, axes=(None,))
    raise ValueError(f"unsupported qk_norm {kind!r}; supported: None, 'rms_norm', 'layer_norm', "
                     "'fp32_layer_norm'")


class Attention(nnx.Module):
    """Self-attention, or joint attention when `added_kv_proj_dim` is set (SD3 MMDiT).

    `context_pre_only=True` (the last SD3 block) keeps the context projections that feed the joint
    attention but drops `to_add_out`: the context output of that block is discarded.
    """

    def __init__(self, dim: int, heads: int, head_dim: int, *, rngs: nnx.Rngs,
                 added_kv_proj_dim: int | None = None, context_pre_only: bool = False,
                 qk_norm: str | None = None, eps: float = 1e-6, dtype=None,
                 param_dtype=jnp.float32, attention_impl="xla", context_parallel_impl="auto"):
        self.heads, self.head_dim = heads, head_dim
        self.attention_impl = resolve_attention_impl(attention_impl, dtype or param_dtype,
                                                     head_dim)
        check_context_parallel_impl(context_parallel_impl)
        self.context_parallel_impl = context_parallel_impl
        inner = heads * head_dim
        lin = {"rngs": rngs, "dtype": dtype, "param_dtype": param_dtype}
        self.to_q = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_k = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_v = Linear(dim, inner, axes=("embed", "heads"), **lin)
        self.to_out = nnx.List([Linear(inner, dim, axes=("heads", "embed"), **lin)])
        self.norm_q = make_qk_norm(qk_norm, head_dim, eps=eps, param_dtype=param_dtype)
        self.norm_k = make_qk_norm(qk_norm, head_dim, eps=eps, param_dtype=param_dtype)
        self.joint = added_kv_proj_dim is not None
        joint, ctx_out = self.joint, self.joint and not context_pre_only
        ctx_in = added_kv_proj_dim or 0  # 0: no joint stream (the projections below are None)
        self.add_q_proj = Linear(ctx_in, inner, axes=("embed", "heads"), **lin) if joint else None
        self.add_k_proj = Linear(ctx_in, inner, axes=("embed", "heads"), **lin) if joint else None
        self.add_v_proj = Linear(ctx_in, inner, axes=("embed", "heads"), **lin) if joint else None
        self.to_add_out = Linear(inner, dim, axes=("heads", "embed"), **lin) if ctx_out else None
        qk_added = qk_norm if joint else None
        self.norm_added_q = make_qk_norm(qk_added, head_dim, eps=eps, param_dtype=param_dtype)
        self.norm_added_k = make_qk_norm(qk_added, head_dim, eps=eps, param_dtype=param_dtype)

    def _heads(self, x):
        return x.reshape(*x.shape[:2], self.heads, self.head_dim)

    def _qkv(self, x, to_q, to_k, to_v, norm_q, norm_k):
        q, k, v = self._heads(to_q(x)), self._heads(to_k(x)), self._heads(to_v(x))
        if norm_q is not None:
            q = norm_q(q)
        if norm_k is not None:
            k = norm_k(k)
        return q, k, v

    def _merge(self, x):
        return x.reshape(*x.shape[:2], self.heads * self.head_dim)

    def _heads_first(self, hidden_states, encoder_hidden_states) -> bool:
        n = hidden_states.shape[1] + (encoder_hidden_states.shape[1] if self.joint else 0)
        return runs_heads_first(self.attention_impl, hidden_states.dtype, self.heads,
                                self.head_dim, n)

    def _qkv_heads_first(self, x, to_q, to_k, to_v, norm_q, norm_k):
        q, k, v = (into_heads(lin, x, self.heads, self.head_dim) for lin in (to_q, to_k, to_v))
        if norm_q is not None:  # over H, the last axis in either layout
            q = norm_q(q)
        if norm_k is not None:
            k = norm_k(k)
        return q, k, v

    def _call_heads_first(self, hidden_states, encoder_hidden_states):
        q, k, v = self._qkv_heads_first(hidden_states, self.to_q, self.to_k, self.to_v,
                                        self.norm_q, self.norm_k)
        t = q.shape[2]
        if self.joint:
            c = self._qkv_heads_first(encoder_hidden_states, self.add_q_proj, self.add_k_proj,
                                      self.add_v_proj, self.norm_added_q, self.norm_added_k)
            q, k, v = (jnp.concatenate(p, axis=2) for p in zip((q, k, v), c, strict=True))
        out = heads_first_kernel(q, k, v)
        sample = from_heads(self.to_out[0], out[:, :, :t], self.heads, self.head_dim)
        if not self.joint:
            return sample
        ctx = (from_heads(self.to_add_out, out[:, :, t:], self.heads, self.head_dim)
               if self.to_add_out is not None else None)
        return sample, ctx

    def __call__(self, hidden_states, encoder_hidden_states=None):
        """Returns the sample output, or (sample, context-or-None) for joint attention."""
        if self._heads_first(hidden_states, encoder_hidden_states):
            return self._call_heads_first(hidden_states, encoder_hidden_states)
        sample = self._qkv(hidden_states, self.to_q, self.to_k, self.to_v, self.norm_q, self.norm_k)
        if not self.joint:
            out = dot_product_attention(*sample, implementation=self.attention_impl,
                                        context_parallel=self.context_parallel_impl)
            return self.to_out[0](self._merge(out))
        context = self._qkv(encoder_hidden_states, self.add_q_proj, self.add_k_proj,
                            self.add_v_proj, self.norm_added_q, self.norm_added_k)
        out, ctx = joint_attention(sample, context, implementation=self.attention_impl,
                                   context_parallel=self.context_parallel_impl)
        out = self.to_out[0](self._merge(out))
        ctx = self.to_add_out(self._merge(ctx)) if self.to_add_out is not None else None
        return out, ctx
