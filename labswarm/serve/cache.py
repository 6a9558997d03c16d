"""Trained models kept loaded between requests: a bounded least-recently-used cache of :class:`Served` models.

A model is loaded once however many requests ask for it at once (the others wait for that load), kept while it is
among the ``capacity`` most recently used, and closed when dropped (its forward thread ends once its queued work
has gone through; a request that already holds it finishes with it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from labswarm.predict import Predictor
from labswarm.serve.batching import BatchedModel


@dataclass
class Served:
    """A loaded model: its :class:`Predictor` (features, classes, experiment) and its batched forward pass."""

    predictor: Predictor
    batched: BatchedModel

    def close(self) -> None:
        """Stop its forward thread (see :meth:`BatchedModel.close`)."""
        self.batched.close()


class ModelCache:
    """At most ``capacity`` loaded models, by key (a job id, a model file's name).

    Args:
        capacity: models kept loaded at once (at least 1).
        load: loads the model of a key; called once per key while it stays cached (its exceptions reach every
            caller waiting for that load, and the key is not cached).

    Attributes:
        loads: how many times ``load`` was called (a cached model is not loaded again).
    """

    def __init__(self, capacity: int, load: Callable[[str], Served]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: at least 1, got {capacity}")
        self.capacity = capacity
        self.load = load
        self.loads = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Future[Served]] = OrderedDict()

    def get(self, key: str) -> Served:
        """The model of ``key``, loaded now if it is not cached (blocks while it loads).

        Raises:
            Exception: whatever ``load`` raised for it.
        """
        with self._lock:
            entry = self._entries.get(key)
            mine = entry is None
            if entry is None:
                entry = self._entries[key] = Future()
                self.loads += 1
            self._entries.move_to_end(key)
        if mine:
            try:
                entry.set_result(self.load(key))
            except BaseException as exc:
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                entry.set_exception(exc)
                raise
            self._evict()
        return entry.result()

    def peek(self, key: str) -> Served | None:
        """The model of ``key`` if it is loaded (marked most recently used), else ``None``; never blocks."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.done() or entry.exception() is not None:
                return None
            self._entries.move_to_end(key)
        return entry.result()

    def drop(self, key: str) -> None:
        """Forget ``key`` (a deleted job), closing its model."""
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None and entry.done() and entry.exception() is None:
            entry.result().close()

    def keys(self) -> list[str]:
        """The cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        """Close every cached model."""
        for key in self.keys():
            self.drop(key)

    def _evict(self) -> None:
        dropped = []
        with self._lock:
            while len(self._entries) > self.capacity:
                oldest = next(iter(self._entries))
                if not self._entries[oldest].done():  # still loading: it stays until it is loaded
                    break
                dropped.append(self._entries.pop(oldest))
        for entry in dropped:
            if entry.exception() is None:
                entry.result().close()
