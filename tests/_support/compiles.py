"""Counting XLA backend compilations (and persistent-cache hits) through jax.monitoring, for
tests that check a program is compiled once and reused."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from jax._src import monitoring
from jax._src.dispatch import BACKEND_COMPILE_EVENT

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileCounter:
    """Counts XLA compilations (and persistent-cache hits) while `counting` is True."""

    def __init__(self):
        self.counting, self.names = False, []

    def _on_compile(self, event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT and self.counting:
            self.names.append(kwargs.get("fun_name", "?"))

    def _on_event(self, event, **kwargs):
        if event == CACHE_HIT_EVENT and self.counting:
            self.names.append("(persistent cache hit)")

    def __enter__(self):
        monitoring.register_event_duration_secs_listener(self._on_compile)
        monitoring.register_event_listener(self._on_event)
        return self

    def __exit__(self, *exc):
        monitoring.unregister_event_duration_listener(self._on_compile)
        monitoring.unregister_event_listener(self._on_event)


@contextlib.contextmanager
def compiles_from_step(first: int) -> Iterator[CompileCounter]:
    """Counts compilations from the start of RL step `first` on (when its batch is read,
    GroupBatcher.batch_at(first - 1)), for a whole run started inside the block, e.g. by
    `wfm_jax.cli.main`. Pick `first` after every kind of work (rollout, update, validation,
    checkpoint, export) has run once: after that nothing may compile."""
    from wfm_jax.data.groups import GroupBatcher
    batch_at = GroupBatcher.batch_at

    def counting_batch_at(self, index):
        counter.counting = index + 1 >= first
        return batch_at(self, index)

    with CompileCounter() as counter, pytest.MonkeyPatch.context() as patch:
        patch.setattr(GroupBatcher, "batch_at", counting_batch_at)
        yield counter
    # an empty count means something only if the run got that far
    assert counter.counting, f"the run never read step {first}'s batch: nothing was counted"
