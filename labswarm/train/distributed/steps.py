"""A distributed learner's steps in one pass of the global cursor, and the read-ahead of a streaming learner.

:class:`CursorSteps` takes one claimed chunk a step (:mod:`labswarm.train.distributed.training`, points 3 and 4).
A learner whose features are kept in memory reads each chunk's crops in the step: a copy from memory. A
**streaming** learner (:mod:`labswarm.train.distributed.data`: the split's features exceed the budget) would read
the chunk's arrays from the store inside the step, ~0.3 ms a sample, about half its rate when the model step is
short (``docs/benchmarks/store.md``). So it claims the **next** step's chunk as soon as it has taken the current
one, and a reader thread (:class:`ReadAhead`) reads that chunk's crops while the step trains: store reads
(memory maps, the cache's requests) and numpy copies release the interpreter lock, and the step is torch's
native code.

Exactly-once is unchanged: the chunk claimed ahead is the one the next step trains, claimed as the next step
would claim it (``claim_fresh``: a fresh chunk, never waiting for a peer's lease), and its lease is renewed when
that step takes it (:meth:`ReadAhead.take`: held across two steps and the waits on peers, it starts its step with a
full ``lease_s``, so no peer's ``claim_orphan`` takes it while it trains); in lockstep it enters the
all-reduce of "who has a chunk" at that next step, as a chunk claimed then would. When that step stops instead
(a halt), it is given back untrained (:meth:`GlobalCursor.release`), as a chunk claimed for that step is; a
learner that dies holding it leaves a lease, which a lockstep checkpoint frees and an asynchronous peer takes
over when it expires. An asynchronous learner with no fresh chunk ahead claims at the step as before (waiting
for a live lease, taking an expired one over).

Memory: one chunk's crops ahead, ``(batch, n_bins, frames)`` float32 (32 x 128 x 431 x 4 B = 7 MB on the demo
set's whole clips), whatever the data size. Why a thread of the learner and not the pipeline's producer
processes (:mod:`labswarm.pipeline.prefetch`): the producers deliver a shard of the epoch fixed when the epoch
starts, while the cursor decides a learner's chunks step by step among its peers; a reader process would
hold its own copy of the split's keys and open store (a remote store's client and cache) and send each batch
back, where a thread shares the learner's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from labswarm.train.distributed import rank0_wait
from labswarm.train.distributed.cursor import Chunk, GlobalCursor
from labswarm.train.distributed.data import TrainingSamples
from labswarm.train.distributed.record import ChunkRecord
from labswarm.train.loop import EpochSteps

log = logging.getLogger(__name__)

#: The cursor index of a lockstep filler's one sample (it trains nothing: training.py, point 3).
FILLER = np.zeros(1, dtype=np.int64)


class ReadAhead:
    """The next step's chunk, claimed early, its crops read by a thread while the current step trains.

    Args:
        samples: the learner's training inputs (streaming).
        cursor: the learner's global cursor.
        epoch: the pass.

    Use :meth:`ahead` after taking a step's chunk, :meth:`take` at the next step, :meth:`close` at the pass's
    end (it gives back a chunk still held ahead). Not thread-safe: one learner's loop calls it.
    """

    def __init__(self, samples: TrainingSamples, cursor: GlobalCursor, epoch: int) -> None:
        self.samples, self.cursor, self.epoch = samples, cursor, epoch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
        self._next: tuple[Chunk, Future[tuple[Any, Any]]] | None = None

    def ahead(self) -> None:
        """Claim the pass's next fresh chunk, if any is left, and start reading its crops.

        Raises:
            CursorError: the cursor's store failed.
        """
        assert self._next is None, "take() the chunk held ahead first"
        chunk = self.cursor.claim_fresh(self.epoch)
        if chunk is not None:
            self._next = (chunk, self._pool.submit(self.samples.batch, self.epoch, chunk.samples.tolist()))

    def take(self) -> Chunk | None:
        """The chunk claimed ahead (its crops still read by :meth:`batch`), its lease renewed to a full
        ``lease_s`` from now (it was claimed a step earlier: its lease covers this step as a chunk claimed now
        would), or ``None``: none held ahead, or its lease was lost (expired and taken over: the new holder trains
        it; this step claims another).

        Raises:
            CursorError: the cursor's store failed.
        """
        if self._next is None:
            return None
        renewed = self.cursor.renew(self._next[0])
        if renewed is None:
            self.drop()
            return None
        self._next = (renewed, self._next[1])
        return renewed

    def batch(self, index: np.ndarray) -> tuple[Any, Any]:
        """The crops of cursor indices ``index`` in the pass: those read ahead when ``index`` is the chunk held
        ahead's (the reader's error, if it failed, is raised here), else read now.

        Returns:
            ``(x, y)``: :meth:`TrainingSamples.batch`'s.
        """
        held, self._next = self._next, None
        if held is not None:
            if np.array_equal(held[0].samples, index):
                return held[1].result()
            _wait(held[1])
        return self.samples.batch(self.epoch, index.tolist())

    def drop(self) -> None:
        """Forget the chunk held ahead without giving it back (the caller released it, or trains nothing more)."""
        if self._next is not None:
            _wait(self._next[1])
            self._next = None

    def close(self) -> None:
        """End of the pass: a chunk still held ahead (a step that raised) is given back, the reader stops."""
        held, self._next = self._next, None
        try:
            if held is not None:
                _wait(held[1])
                self.cursor.release(held[0])
        except Exception as exc:  # the store is gone with a failing job: its lease expires or a checkpoint frees it
            log.warning("could not give back chunk %d read ahead: %s", held[0].index if held else -1, exc)
        finally:
            self._pool.shutdown(wait=True)


def _wait(future: Future[Any]) -> None:
    """Let a read finish (its result, or its error, unused)."""
    with contextlib.suppress(Exception):  # a read nobody trains: its error does not matter
        future.result()


class CursorSteps(EpochSteps):
    """A pass of the global cursor: one claimed chunk a step (training.py, points 3 and 4), the next one read
    ahead when the learner streams (module docstring). ``learner``: the
    :class:`~labswarm.train.distributed.training.DistributedTraining` (not imported: it imports this module)."""

    def __init__(self, learner: Any, torch: Any, epoch: int, device: Any,
                 partial: Mapping[str, Any] | None) -> None:
        sums = {"loss_sum": 0.0, "correct": 0, "seen": 0, "steps": 0, "chunks": 0, "seconds": 0.0}
        if partial is not None and partial.get("rank") == learner.rank:  # an asynchronous rank may get rank 0's
            sums.update({k: v for k, v in partial.items() if k in sums})
        super().__init__(epoch, sums)
        assert learner.cursor is not None and learner.samples is not None
        self.learner, self.cursor, self.samples = learner, learner.cursor, learner.samples
        self.torch, self.device = torch, device
        self.trained: ChunkRecord | None = None  # the chunk record, open for the pass
        self.chunk: Chunk | None = None
        self.index = FILLER
        self.peer_wait_s = 0.0
        self._first = True
        self.reader = ReadAhead(self.samples, self.cursor, epoch) if self.samples.streaming else None
        rank0_wait.begun(learner, str(epoch))  # rank 0 validated and checkpointed the pass before: peers go on

    def before_step(self, stop: bool) -> tuple[Any, Any] | None:
        if self._first:  # rank 0's peers wait for it in the store, not in the collective (rank0_wait.py)
            rank0_wait.wait(self.learner, str(self.epoch))
        ahead = self.reader.take() if self.reader is not None else None
        chunk, verdict = self.learner._claim(self.torch, self.epoch, stop, ahead)
        if self._first and self.learner._joined:  # after the first collective every peer has begun the epoch
            now = time.perf_counter()
            self.peer_wait_s, self.started = now - self.started, now
        self._first = False
        if verdict != "train":
            self.halted = verdict == "halt"
            if self.reader is not None:
                self.reader.drop()  # a chunk held ahead was given back by _claim
            return None
        self.chunk, self.filler = chunk, chunk is None
        self.index = chunk.samples if chunk is not None else FILLER
        if self.reader is None:
            x, y = self.samples.batch(self.epoch, self.index.tolist())
        else:
            x, y = self.reader.batch(self.index)
            self.reader.ahead()  # the next step's chunk, read while this one trains
        return x.to(self.device), y.to(self.device)

    def after_step(self) -> bool:
        """``True`` when this learner's chunk is marked done: a filler, or a lost lease (its new holder trains it),
        does not count. The chunk's line is in the record before the done mark (a kill between the two leaves a
        line whose chunk is not done under its owner: :func:`labswarm.train.distributed.record.counted`)."""
        chunk = self.chunk
        if chunk is None:
            return False
        assert self.trained is not None
        self.trained.trained(self.epoch, chunk.index, self.samples.ids(self.index.tolist()))
        if not self.cursor.done(chunk):
            self.trained.lost(self.epoch, chunk.index)
            return False
        self.sums["chunks"] += 1
        return True

    def after_epoch(self, record: dict[str, Any]) -> None:
        learner = self.learner
        record.update(peer_wait_s=self.peer_wait_s, respawns=0, failed_samples=0, rank=learner.rank,
                      world_size=learner.context.world_size, chunks=self.sums["chunks"], steps=self.sums["steps"],
                      elapsed_s=time.perf_counter() - learner.started, comm=learner.comm().as_dict(),
                      lr_scale=getattr(learner.lr_scaling, "last", 1.0))  # the last step's (lr_scaling.py)

    def halt(self) -> dict[str, Any]:
        self.learner._halt(self.epoch, self.sums)
        return {**self.sums, "rank": self.learner.rank}

    def close(self) -> None:
        """The pass ended (or failed): the reader stops, a chunk still held ahead is given back."""
        if self.reader is not None:
            self.reader.close()
