"""The reference server's work queue and result store (no HTTP here).

Bounded queue: ``submit`` raises ``QueueFull`` instead of dropping anything. Results stay until
every requested reward name was pulled (plus a short grace so a lost answer can be pulled again)
or until ``ttl_s`` after completion.
"""
from __future__ import annotations

import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PULL_GRACE_S = 30.0

Scorer = Callable[[str, dict, np.ndarray], dict]  # (reward name, header, media) -> {key: list}
# (header, media) -> (header, media) once per task before its rewards, e.g. latents -> video
Prepare = Callable[[dict, np.ndarray], tuple]


class QueueFull(Exception):
    pass


@dataclass
class Task:
    uuid: str
    header: dict
    media: np.ndarray
    names: list[str]
    received: float
    done_at: float | None = None
    results: dict[str, dict] = field(default_factory=dict)   # name -> pull answer
    errors: dict[str, str] = field(default_factory=dict)     # name -> failure message
    pulled: set[str] = field(default_factory=set)
    expires: float = float("inf")


class TaskStore:
    def __init__(self, scorer: Scorer, *, max_queue: int = 64, ttl_s: float = 3600.0,
                 workers: int = 1, clock=time.monotonic, prepare: Prepare | None = None):
        self._scorer = scorer
        self._prepare = prepare
        self._queue: queue.Queue[Task | None] = queue.Queue(maxsize=max_queue)
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._ttl = ttl_s
        self._clock = clock
        self._threads = [threading.Thread(target=self._work, name=f"reward-worker-{i}", daemon=True)
                         for i in range(workers)]
        self.max_queue = max_queue

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        for _ in self._threads:
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                break  # daemon workers die with the process
        for t in self._threads:
            t.join(timeout=5.0)

    def submit(self, header: dict, media: np.ndarray, names: list[str]) -> str:
        task = Task(str(uuidlib.uuid4()), header, media, names, self._clock())
        with self._lock:
            self._expire()
            self._tasks[task.uuid] = task
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            with self._lock:
                del self._tasks[task.uuid]
            raise QueueFull(f"reward queue is full ({self.max_queue} tasks waiting); retry later") from None
        return task.uuid

    def pull(self, uuid: str, name: str) -> tuple[str, object]:
        """-> ("ready", answer) | ("pending", None) | ("failed", message) | ("unknown", message)."""
        with self._lock:
            self._expire()
            task = self._tasks.get(uuid)
            if task is None:
                return "unknown", f"uuid {uuid} is unknown or its results expired"
            if name not in task.names:
                return "unknown", f"uuid {uuid} was not asked for reward {name!r} (asked: {task.names})"
            if task.done_at is None:
                return "pending", None
            task.pulled.add(name)
            if task.pulled >= set(task.names):
                task.expires = min(task.expires, self._clock() + PULL_GRACE_S)
            if name in task.errors:
                return "failed", task.errors[name]
            return "ready", task.results[name]

    def counts(self) -> dict:
        with self._lock:
            pending = sum(t.done_at is None for t in self._tasks.values())
            return {"queued": self._queue.qsize(), "pending": pending, "stored": len(self._tasks)}

    def _expire(self) -> None:  # caller holds the lock
        now = self._clock()
        for key in [k for k, t in self._tasks.items() if t.expires <= now]:
            del self._tasks[key]

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            header, media, decoded_s = task.header, task.media, 0.0
            input_info = {"shape": list(media.shape), "dtype": str(media.dtype)}
            if self._prepare is not None:
                start = time.monotonic()
                try:
                    header, media = self._prepare(header, media)
                except Exception as exc:  # every asked reward reports the decode failure
                    task.errors.update({name: f"decoding the {header.get('media_type')} payload "
                                              f"failed on the server: {type(exc).__name__}: {exc}"
                                        for name in task.names})
                decoded_s = time.monotonic() - start
            for name in task.names:
                if name in task.errors:
                    continue
                start = time.monotonic()
                try:
                    scores = self._scorer(name, header, media)
                    task.results[name] = {
                        "scores": scores,
                        "input_info": input_info,
                        "duration": time.monotonic() - start,
                        "decoded_duration": decoded_s,
                        "type": name,
                    }
                except Exception as exc:  # report, never drop: the pull answers with this message
                    task.errors[name] = f"reward {name!r} failed on the server: {type(exc).__name__}: {exc}"
            media = None
            task.media = None  # free the batch; results are small
            with self._lock:
                task.done_at = self._clock()
                task.expires = task.done_at + self._ttl
