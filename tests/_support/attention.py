"""Recording which attention path a module takes, for the tests of the Pallas kernel's layout."""
from __future__ import annotations

from wfm_jax.models.layers import context_parallel as cp


def record_heads_first(monkeypatch) -> list:
    """A list that gets one entry per call of cp.sharded_heads_first_attention (the kernel in its
    own (B, N, T, H) layout under a mesh), which still runs as before."""
    taken: list = []
    heads_first = cp.sharded_heads_first_attention
    monkeypatch.setattr(cp, "sharded_heads_first_attention",
                        lambda *a: taken.append(1) or heads_first(*a))
    return taken
