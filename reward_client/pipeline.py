"""Background execution of reward jobs and the accounting of every uuid they enqueue.

The trainer submits a batch as soon as it is decoded; a worker thread enqueues it and pulls the
results while rollouts continue; ``handle.result()`` later blocks only if they are not in yet.
The ``Ledger`` records each uuid with the reward names asked of it and marks each as pulled or
failed, so nothing enqueued goes unaccounted; ``close()`` reports handles whose results were never
collected.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("reward_client")


class Ledger:
    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, set[str]] = {}
        self.counts = {"enqueued": 0, "pulled": 0, "failed_pulls": 0}

    def enqueued(self, uuid: str, names) -> None:
        with self._lock:
            self._open[uuid] = set(names)
            self.counts["enqueued"] += 1

    def settle(self, uuid: str, name: str, ok: bool) -> None:
        with self._lock:
            self._open.get(uuid, set()).discard(name)
            if not self._open.get(uuid, True):
                del self._open[uuid]
            self.counts["pulled" if ok else "failed_pulls"] += 1

    def unaccounted(self) -> dict[str, list[str]]:
        """{uuid: reward names neither pulled nor reported failed}; empty once every job has finished."""
        with self._lock:
            return {u: sorted(n) for u, n in self._open.items()}


class RewardHandle:
    """Result of one submitted batch; ``result()`` returns the job's value or raises its error."""

    def __init__(self, batch_size: int):
        self._future: Future | None = None
        self.batch_size = batch_size
        self.uuids: list[str] = []  # filled by the job as soon as the service answers the enqueue
        self.collected = False

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None):
        self.collected = True
        return self._future.result(timeout)


class RewardPipeline:
    def __init__(self, max_inflight: int = 2):
        if max_inflight < 1:
            raise ValueError(f"max_inflight={max_inflight} must be >= 1")
        # Jobs beyond max_inflight wait in the executor's queue: delayed, never dropped.
        self._pool = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="reward")
        self._handles: list[RewardHandle] = []
        self._lock = threading.Lock()

    def start(self, job: Callable[[RewardHandle], object], batch_size: int) -> RewardHandle:
        handle = RewardHandle(batch_size)
        try:
            handle._future = self._pool.submit(job, handle)
        except RuntimeError:  # the executor refuses work after shutdown
            raise RuntimeError("this RewardComputer is closed; create a new one to submit") from None
        with self._lock:
            self._handles = [h for h in self._handles if not (h.collected and h.done())] + [handle]
        return handle

    def close(self) -> list[str]:
        """Wait for every job (each is bounded by its budget); -> descriptions of uncollected results."""
        self._pool.shutdown(wait=True)
        with self._lock:
            lost = [f"batch of {h.batch_size} (uuids {h.uuids or 'none'})"
                    for h in self._handles if not h.collected]
            self._handles = []
        for item in lost:
            log.warning("reward result never collected: %s", item)
        return lost
