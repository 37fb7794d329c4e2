"""SIGTERM (cluster preemption) stops a run the way Ctrl-C does, but after the step in progress
and with a checkpoint of it: the loops call `requested()` after every step. A second SIGTERM
stops at once (KeyboardInterrupt), as does Ctrl-C."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

import jax

_received = {"count": 0}


class Stopped(KeyboardInterrupt):
    """The run stopped on SIGTERM after `step`, whose checkpoint is saved."""

    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


def _on_sigterm(signum, frame) -> None:
    _received["count"] += 1
    if _received["count"] > 1:
        raise KeyboardInterrupt
    print("SIGTERM: finishing this step, then saving a checkpoint and stopping (send it again "
          "to stop at once)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigterm_stops_after_step() -> Iterator[None]:
    """Install the SIGTERM handler for the duration (main thread only: signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received["count"] = 0
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _received["count"] = 0


def requested() -> bool:
    """True when any process got SIGTERM: all processes must stop at the same step, since the
    final checkpoint is a collective save."""
    local = _received["count"] > 0
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils
    import numpy as np
    return bool(np.any(multihost_utils.process_allgather(np.array([local]))))
