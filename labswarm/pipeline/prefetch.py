"""Multiprocess prefetch: producer processes build batches ahead of the trainer, under a memory watchdog.

Producer ``k`` of ``n`` runs the chain of blocks before the prefetch block on its shard of the epoch's samples
(:attr:`Context.shard`), seeded from (training seed, epoch, producer id, rank), and puts its batches, in order
and numbered, into its own bounded queue. The trainer takes batch ``j`` of the epoch from producer ``j mod n``
(skipping producers that have finished): the order is deterministic for a seed, a number of producers and a
rank, however fast each producer runs.

**Hand-off.** A batch's feature arrays do not go through the queue's pipe: the producer writes them into a free
slot of its ring of shared-memory slots (:mod:`labswarm.pipeline.shm`; ``depth + 2`` slots that the trainer
creates, sizes from the first batch and unlinks) and puts the batch without them, with where they lie; the
trainer copies them out (the batch it returns owns its arrays) and gives the slot back. The first batches of a
producer, before its ring is sized, and anything that is not a :class:`Batch` travel pickled.

**Memory watchdog.** Every ``check_interval`` seconds the consumer reads each producer's unique set size
(psutil USS: the memory only that producer holds; its RSS would also count the pages it shares with the trainer
after a fork). A producer above ``memory_limit_mb`` is asked to retire: it stops after the batch it is building and
exits; the consumer keeps taking the batches already in its queue, then starts a replacement that skips the
batches already delivered (``Context.skip``: skipped batches read no features). A retiring producer whose queue
holds batches may be waiting for the trainer (to put its last batch, or for a free slot): its grace starts again.
One that has not exited after its queue stayed empty for ``grace`` seconds, or that dies, is killed and its queue
discarded (a killed writer may leave half a
message: the trainer keeps no write end of a producer's pipe, so that reads as end-of-file, not as a wait for the
rest); the replacement resumes after the last batch delivered. Batches are numbered, so none is lost or
delivered twice within the epoch; a gap in the numbers (a batch that could not be pickled) fails the epoch, and
so does a producer that dies :data:`MAX_DEATHS` times in a row at the same batch. A replacement gets a new ring
(of the old one's size); the old one, and whatever a killed producer left half written in it, is unlinked.

**Resume.** :meth:`Prefetcher.state_dict` (batches delivered per producer, whose turn is next) restarts an epoch
where it stopped (:meth:`Prefetcher.__init__`'s ``state``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue as queue_module
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import psutil
from pydantic import Field

from labswarm.errors import LabswarmError
from labswarm.pipeline.base import Block, BlockConfig, Context, chain, register_block
from labswarm.pipeline.producer import Flag, produce, resumed
from labswarm.pipeline.shm import MAX_SLOTS, SlotRing

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

log = logging.getLogger(__name__)

#: A producer that dies this many times in a row at the same batch fails the epoch instead of being replaced.
MAX_DEATHS = 3


class PipelineError(LabswarmError):
    """A producer process failed (the message carries its traceback), or the pipeline is misused."""


class PrefetchConfig(BlockConfig):
    """Parameters of the prefetch block.

    Attributes:
        producers: producer processes; ``0`` runs the chain in the trainer's process (no prefetch).
        depth: batches each producer may hold ready in its queue.
        memory_limit_mb: unique set size (USS) in MiB above which a producer is replaced; ``None``: no watchdog.
        check_interval: seconds between two memory checks.
        grace: seconds a retiring producer has to exit, counted while its queue is empty (while it holds
            batches the trainer has not taken, it may be waiting for the trainer), before it is killed.
        start_method: how producers start (``fork`` is fastest on Linux; ``spawn`` re-imports everything).
        threads: maths-library threads per producer (BLAS / OpenMP / torch).
    """

    producers: int = Field(2, ge=0)
    depth: int = Field(4, ge=1)
    memory_limit_mb: float | None = Field(None, gt=0)
    check_interval: float = Field(0.5, gt=0)
    grace: float = Field(10.0, gt=0)
    start_method: Literal["fork", "spawn", "forkserver"] = "fork"
    threads: int = Field(1, ge=1)


@register_block
class Prefetch(Block[PrefetchConfig]):
    """Marks where a chain is split between producer processes and the trainer. In a
    :class:`~labswarm.pipeline.pipeline.Pipeline` the blocks before it run in :class:`Prefetcher` producers;
    called directly in a chain, it passes its items through."""

    name = "prefetch"
    config_model = PrefetchConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        if items is None:
            raise ValueError("prefetch needs a block before it")
        return items


def _context(method: Literal["fork", "spawn", "forkserver"]) -> ForkContext | SpawnContext | ForkServerContext:
    """``multiprocessing.get_context(method)``, one literal at a time so that the type checker knows it has a
    ``Process`` (a plain ``str`` gets a ``BaseContext``, which has none)."""
    if method == "fork":
        return mp.get_context("fork")
    if method == "forkserver":
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


@dataclass
class _Slot:
    """One producer: its process, queue, ring of shared-memory slots and retire event, and how many of its
    batches were delivered."""

    index: int
    process: Any = None
    queue: Any = None
    ring: SlotRing | None = None
    retire: Any = None
    delivered: int = 0
    done: bool = False
    retire_at: float | None = None
    spawned: int = 0
    memory_peak: int = field(default=0)  #: highest unique set size seen, bytes
    deaths: int = 0
    died_at: int = -1


class Prefetcher:
    """Iterator over one epoch's batches, built ahead by producer processes (see the module docstring).

    Args:
        blocks: the chain the producers run (source … batch), picklable.
        ctx: the context of the epoch; ``producer``, ``producers`` and ``skip`` are set per producer here.
        config: the prefetch parameters; ``producers == 0`` runs the chain in this process.
        state: a :meth:`state_dict` of this epoch to resume from.

    Raises:
        PipelineError: (when iterated) a producer raised; the message carries its traceback.
    """

    def __init__(self, blocks: Sequence[Block[Any]], ctx: Context, config: PrefetchConfig | None = None,
                 state: dict[str, Any] | None = None) -> None:
        self.blocks = list(blocks)
        self.config = config or PrefetchConfig(name="prefetch")
        self.n = max(1, self.config.producers)
        self.ctx = ctx.with_(producers=self.n)
        self.in_process = self.config.producers == 0
        self._mp = _context(self.config.start_method)
        self._stop = Flag(self._mp)
        self.slots = [_Slot(k) for k in range(self.n)]
        self.turn = 0
        self.respawns = 0  #: producers replaced so far (memory watchdog or death)
        self.waited = 0.0  #: seconds spent waiting for a batch
        self._last_check = 0.0
        self._local: Iterator[Any] | None = None
        if state is not None:
            self._load(state)
        self._closed = False
        if not self.in_process:
            for slot in self.slots:
                if not slot.done:
                    self._spawn(slot)

    # state
    def state_dict(self) -> dict[str, Any]:
        """``{epoch, producers, delivered: [per producer], done: [per producer], turn}``: where the epoch is."""
        return {"epoch": self.ctx.epoch, "producers": self.n, "delivered": [s.delivered for s in self.slots],
                "done": [s.done for s in self.slots], "turn": self.turn}

    def _load(self, state: dict[str, Any]) -> None:
        if state.get("epoch") != self.ctx.epoch or state.get("producers") != self.n:
            raise PipelineError(
                f"cannot resume: the state is of epoch {state.get('epoch')} with {state.get('producers')} "
                f"producers, this epoch is {self.ctx.epoch} with {self.n}"
            )
        for slot, delivered, done in zip(self.slots, state["delivered"], state["done"], strict=True):
            slot.delivered, slot.done = int(delivered), bool(done)
        self.turn = int(state["turn"])

    # producers
    def _spawn(self, slot: _Slot) -> None:
        slot.queue = self._mp.Queue(self.config.depth)
        slot.retire = Flag(self._mp)
        slot.retire_at = None
        # a fresh ring (sized as the last one): nothing in it is left unread, nothing written by a dead producer
        slot.ring = SlotRing(min(self.config.depth + 2, MAX_SLOTS), slot.ring.size if slot.ring is not None else 0)
        ctx = self.ctx.with_(producer=slot.index, skip=slot.delivered)
        slot.process = self._mp.Process(
            target=produce, name=f"labswarm-producer-{slot.index}", daemon=True,
            args=(self.blocks, ctx, slot.queue, slot.ring.reader, self._stop, slot.retire, self.config.threads),
        )
        slot.process.start()
        # The producer holds the only write end of its pipe: when it dies, a read gets end-of-file (EOFError,
        # or OSError in the middle of a message) instead of waiting forever for the rest of a half-written one.
        slot.queue._writer.close()
        slot.spawned += 1

    def _replace(self, slot: _Slot, why: str, level: int = logging.WARNING) -> None:
        log.log(level, "replacing producer %d (pid %s): %s; it resumes after batch %d",
                slot.index, slot.process.pid, why, slot.delivered)
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        slot.queue.close()
        slot.queue.cancel_join_thread()
        if slot.ring is not None:
            slot.ring.close()
        self.respawns += 1
        self._spawn(slot)

    def _watch(self) -> None:
        """The memory watchdog: ask producers over the limit to retire; kill those past their grace.

        The grace runs only while a retiring producer could make progress: while its queue holds batches, the
        trainer has not taken what it made (it may be blocked putting its last batch, or waiting for a free slot,
        and this check only runs while the trainer waits for a batch), so its clock starts again.
        """
        limit = self.config.memory_limit_mb
        now = time.monotonic()
        if limit is None or now - self._last_check < self.config.check_interval:
            return
        self._last_check = now
        for slot in self.slots:
            if slot.done or slot.process is None or not slot.process.is_alive():
                continue
            if slot.retire_at is not None:
                if not slot.queue.empty():  # waiting for the trainer, not stuck: the grace starts again
                    slot.retire_at = now
                elif now - slot.retire_at > self.config.grace:
                    self._replace(slot, f"did not retire within {self.config.grace} s")
                continue
            try:
                # USS, not RSS: a forked producer's RSS counts every page it still shares with the trainer
                # (measured: 319 MiB right after forking a 300 MiB parent, USS 2 MiB)
                rss = psutil.Process(slot.process.pid).memory_full_info().uss
            except psutil.Error:
                continue
            slot.memory_peak = max(slot.memory_peak, rss)
            if rss > limit * 2**20:
                log.warning("producer %d uses %.0f MiB > %.0f MiB: retiring it", slot.index, rss / 2**20, limit)
                slot.retire.set()
                slot.retire_at = now

    def _get(self, slot: _Slot) -> tuple:
        while True:
            self._watch()
            try:
                return slot.queue.get(timeout=0.05)
            except queue_module.Empty:
                if slot.process.is_alive():
                    continue
                try:  # exited: take what it flushed before exiting
                    return slot.queue.get(timeout=0.05)
                except (queue_module.Empty, EOFError, OSError):
                    pass
            except (EOFError, OSError):  # its end of the pipe is closed: every message was read (EOFError), or
                pass                     # it died in the middle of one (OSError), which is discarded with the queue
            slot.process.join(5)
            if slot.retire_at is not None and slot.process.exitcode == 0:
                self._replace(slot, "it retired", logging.INFO)
            else:
                code = slot.process.exitcode
                slot.deaths = slot.deaths + 1 if slot.died_at == slot.delivered else 1
                slot.died_at = slot.delivered
                if slot.deaths >= MAX_DEATHS:  # it would die there again and again: give up
                    raise PipelineError(f"producer {slot.index} died {slot.deaths} times at its batch "
                                        f"{slot.delivered} (exit code {code})")
                self._replace(slot, f"it died (exit code {code})")

    # iteration
    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        if self.in_process:
            return self._next_local()
        started = time.perf_counter()
        try:
            while not all(s.done for s in self.slots):
                slot = self.slots[self.turn]
                if slot.done:
                    self.turn = (self.turn + 1) % self.n
                    continue
                kind, *rest = self._get(slot)
                if kind == "error":
                    raise PipelineError(f"producer {slot.index} failed:\n{rest[0]}")
                seq = rest[0]
                if seq > slot.delivered:  # the queue's feeder thread dropped a message it could not pickle
                    raise PipelineError(
                        f"batch {slot.delivered} of producer {slot.index} never came (got {kind} {seq}): it could "
                        "not be sent, see the producer's stderr for the pickling error"
                    )
                if kind == "end":
                    slot.done = True
                    self.turn = (self.turn + 1) % self.n
                    continue
                batch, placement = rest[1:]
                if placement is not None:  # copy the arrays out of their slot (not for a replay), free the slot
                    ring = slot.ring
                    assert ring is not None, "a batch placed in a ring that _spawn never made"
                    arrays = ring.receive(placement, copy=seq == slot.delivered)
                    if arrays is not None:
                        batch.features = arrays
                    for other in self.slots if placement.need else ():  # the first batches tell their size:
                        if other.ring is not None:                        # start every producer's ring with it
                            other.ring.start(ring.size)
                if seq < slot.delivered:  # a replay of a batch already delivered: drop it
                    continue
                slot.delivered += 1
                self.turn = (self.turn + 1) % self.n
                return batch
        finally:
            self.waited += time.perf_counter() - started
        self.close()
        raise StopIteration

    def _next_local(self) -> Any:
        slot = self.slots[0]
        if self._local is None:
            items = chain(self.blocks, self.ctx.with_(producer=0, producers=1, skip=slot.delivered))
            self._local = resumed(items, slot.delivered)
        started = time.perf_counter()
        try:
            for _seq, batch in self._local:
                slot.delivered += 1
                return batch
        finally:
            self.waited += time.perf_counter() - started
        slot.done = True
        raise StopIteration

    def close(self) -> None:
        """Stop the producers (graceful, then killed after 2 s), free their queues and unlink their rings of
        shared memory; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        live = [s for s in self.slots if s.process is not None]
        deadline = time.monotonic() + 2.0
        for slot in live:
            while slot.process.is_alive() and time.monotonic() < deadline:
                with contextlib.suppress(queue_module.Empty, OSError, EOFError):
                    slot.queue.get(timeout=0.02)  # unblock a feeder thread stuck on a full pipe
        for slot in live:
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join(5)
            slot.queue.close()
            slot.queue.cancel_join_thread()
        for slot in self.slots:
            if slot.ring is not None:
                slot.ring.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown anything may be gone
            self.close()
