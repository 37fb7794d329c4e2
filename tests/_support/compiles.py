"""Counting XLA backend compilations (and persistent-cache hits) through jax.monitoring, for
tests that check a program is compiled once and reused."""
from __future__ import annotations

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
