"""A prefetch producer process (:class:`labswarm.pipeline.prefetch.Prefetcher` starts them): it runs the chain
of blocks before the prefetch block on its shard of the epoch and hands each batch to the trainer, its feature
arrays in a shared-memory slot of its ring (:mod:`labswarm.pipeline.shm`) or pickled in the message.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import queue as queue_module
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from labswarm.pipeline.base import Batch, Block, Context, chain
from labswarm.pipeline.shm import SlotWriter
from labswarm.threads import limit_threads


class Flag:
    """A flag the trainer sets and producer processes read (``stop``, ``retire``), with no lock: one byte of shared
    memory (``multiprocessing`` ``RawValue(c_bool)``; a byte's read and write are atomic).
    ``multiprocessing.Event`` takes a semaphore even to read, and a producer killed (SIGKILL: the memory watchdog,
    the OOM killer) while holding it left it taken for good: every other producer and the replacement blocked in
    ``is_set()`` (seen in CI, 2026-11-26: tests/pipeline/test_prefetch.py's fork case, a producer killed
    mid-epoch). Picklable to a process at its start, with any start method.

    Args:
        ctx: the multiprocessing context the producers are started with.
    """

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        """Set the flag (never cleared)."""
        self._value.value = True

    def is_set(self) -> bool:
        """Whether the flag was set."""
        return bool(self._value.value)


def produce(blocks: Sequence[Block[Any]], ctx: Context, out: Any, credits: Any, stop: Any, retire: Any,
             threads: int) -> None:
    """A producer process: run the chain, put ``("batch", seq, batch, placement)`` per batch (the batch without
    its arrays when :class:`~labswarm.pipeline.shm.Placement` says which slot of the ring holds them), then
    ``("end", n)``; on an error put ``("error", traceback)``. Returns early when ``stop`` or ``retire`` is set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops us
    limit_threads(threads)
    torch = sys.modules.get("torch")  # only when the trainer imported it: a producer should not pay the import
    if torch is not None:
        torch.set_num_threads(threads)

    def put(message: tuple) -> bool:
        while not stop.is_set():
            try:
                out.put(message, timeout=0.1)
                return True
            except queue_module.Full:
                continue
        return False

    slots = SlotWriter(credits)

    def message(seq: int, batch: Any) -> tuple | None:
        features = arrays(batch)
        if features is None:
            return ("batch", seq, batch, None)
        placement = slots.place(features, stop.is_set)
        if placement is None:  # stopped while waiting for a free slot
            return None
        if placement.slot is None:  # no slot (yet): the arrays go pickled, the placement says how large
            return ("batch", seq, batch, placement)
        light = copy.copy(batch)  # the batch without its arrays (whatever other fields it has)
        light.features = {}
        return ("batch", seq, light, placement)

    made = ctx.skip
    try:
        for seq, batch in resumed(chain(blocks, ctx), ctx.skip):
            if stop.is_set() or (sent := message(seq, batch)) is None or not put(sent):
                return
            made = seq + 1
            if retire.is_set():
                return
        put(("end", made))
    except Exception:  # every failure goes to the trainer, with its traceback
        put(("error", traceback.format_exc()))
    finally:
        slots.close()


def resumed(items: Iterator[Any], skip: int) -> Iterator[tuple[int, Any]]:
    """``(position, item)`` of a chain's output from position ``skip`` on: the first ``skip`` are dropped, whether
    :data:`~labswarm.pipeline.base.SKIPPED` markers (a batch block skips without reading features) or the items
    of a chain without a batch block."""
    return itertools.islice(enumerate(items), skip, None)


def arrays(item: Any) -> dict[str, np.ndarray] | None:
    """The feature arrays of a batch, to hand over in shared memory; ``None`` for any other item, a batch
    without arrays, or one with arrays of Python objects (those go pickled)."""
    if not isinstance(item, Batch) or not isinstance(item.features, dict) or not item.features:
        return None
    values = item.features.values()
    return item.features if all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in values) else None
