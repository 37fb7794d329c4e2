"""A checkpointable shuffle of consecutive windows of a stream (numpy permutations; grain's own
WindowShuffleIterDataset costs milliseconds per element at small windows on this grain).

Window k holds the parent's next `window` elements, emitted in the order
default_rng([seed, k]).permutation(n). State: the parent's state at the window's start, k and
the position inside the window; a restore re-reads that window from the parent. At a window
boundary the state is the parent's current state, so a restore there reads nothing twice.
"""
from __future__ import annotations

import grain
import numpy as np


class _WindowShuffleIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, window: int, seed: int):
        super().__init__(parent)
        self._window, self._seed = window, seed
        self._k, self._pos, self._items = 0, 0, []
        self._start = parent.get_state()

    def _fill(self) -> None:
        self._start = self._parent.get_state()
        items = []
        for _ in range(self._window):
            try:
                items.append(next(self._parent))
            except StopIteration:
                break
        order = np.random.default_rng([self._seed, self._k]).permutation(len(items))
        self._items = [items[i] for i in order]
        self._pos = 0

    def __next__(self):
        if self._pos >= len(self._items):
            if self._items:
                self._k += 1
            self._fill()
            if not self._items:
                raise StopIteration
        item = self._items[self._pos]
        self._pos += 1
        return item

    def get_state(self):
        if self._pos >= len(self._items):  # between windows: nothing buffered
            k = self._k + 1 if self._items else self._k
            return {"parent": self._parent.get_state(), "window": k, "pos": 0}
        return {"parent": self._start, "window": self._k, "pos": self._pos}

    def set_state(self, state):
        self._parent.set_state(state["parent"])
        self._k, self._items, self._pos = int(state["window"]), [], 0
        if state["pos"]:
            self._fill()
            self._pos = int(state["pos"])


class WindowShuffleIterDataset(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, window: int, seed: int):
        super().__init__(parent)
        self._window, self._seed = int(window), int(seed)

    def __iter__(self):
        return _WindowShuffleIterator(self._parent.__iter__(), self._window, self._seed)
