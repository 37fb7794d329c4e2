"""Time budget and retry/poll delays (pure; clocks and random sources are injectable for tests)."""
from __future__ import annotations

import random
import time


class Deadline:
    """A total time budget that every request and every sleep of one reward job draws from."""

    def __init__(self, budget_s: float, clock=time.monotonic):
        self.budget_s = float(budget_s)
        self._clock = clock
        self._end = clock() + self.budget_s

    def remaining(self) -> float:
        return max(0.0, self._end - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


def backoff_delay(attempt: int, initial_s: float, max_s: float, jitter: float,
                  rng: random.Random) -> float:
    """Exponential backoff: initial * 2**attempt capped at max, spread by +-jitter (a fraction)
    so that many trainer processes hitting one service do not retry in lockstep."""
    base = min(max_s, initial_s * (2.0 ** min(attempt, 60)))
    spread = 1.0 + jitter * (2.0 * rng.random() - 1.0)
    return max(0.0, min(max_s, base * spread))


def poll_delay(poll: int, initial_s: float, max_s: float) -> float:
    """'Not ready' polls grow gently: results usually arrive within a few seconds."""
    return min(max_s, initial_s * (1.5 ** min(poll, 60)))
