"""Rings of shared-memory slots: a producer process hands the arrays of a batch to the trainer without pickling
them through a pipe.

Each producer process has a ring of slots (POSIX shared-memory segments,
``/dev/shm/labswarm_<pid namespace>_<trainer pid>_…``)
and its own one-way pipe of :class:`Credit` s. The trainer's :class:`SlotRing` owns the segments: it alone creates,
grows and unlinks them. The producer's :class:`SlotWriter` takes a credit (a free slot), writes a batch's arrays
into it and says where they lie in its message (:class:`Placement`, a few hundred bytes); the trainer copies them
out (:meth:`SlotRing.receive`) and gives the slot back with a new credit. Until the first credit comes, or when no
free slot is large enough, the arrays travel pickled in the message, which tells the trainer how large the slots
must be (``need``) and gives back the slots that were too small: the ring is sized by the first batch (exact) and
grows by at least :data:`GROWTH` when a larger one comes.

A ring serves one producer *process*: a replacement gets a fresh ring (the old one, with whatever a killed
producer left half written in it, is unlinked), so a new producer never writes into a slot the trainer has not
read. Segments are unlinked by :meth:`SlotRing.close`, when the ring is garbage collected, and at interpreter exit;
if the trainer is killed, multiprocessing's resource tracker unlinks them, and if the tracker was killed with it
(SIGKILL to the process group), the next ring created in the same pid namespace unlinks what that dead trainer
left (:func:`labswarm.pipeline.segments.sweep_stale`). Producers attach to a segment without
registering it with the resource tracker: before Python 3.13 every attach registers (gh-82300), and a producer
forked before the trainer's tracker started would start a tracker of its own, which unlinks the trainer's live
segments when the producer exits and warns of leaks.

A producer reserves a slot's memory when it first attaches to it (``posix_fallocate``, which costs what its
first write would): a full ``/dev/shm`` (Docker gives 64 MiB unless told ``--shm-size``) then fails there with
``OSError`` instead of killing it with ``SIGBUS`` as it writes, and it sends its batches pickled from then on, as
it does when the trainer cannot create a segment (a warning says so).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from labswarm.pipeline import segments

log = logging.getLogger(__name__)

#: Byte offsets of the arrays in a slot are multiples of this (a cache line).
ALIGN = 64
#: A ring that must grow grows to at least this factor times its slot size (batches that vary regrow rarely).
GROWTH = 1.25
#: Most slots in a ring: their credits (~120 bytes each) always fit in a pipe's buffer, so giving them never blocks.
MAX_SLOTS = 64


@dataclass(frozen=True)
class ArraySpec:
    """Where one array lies in a slot.

    Attributes:
        key: the array's name (a feature output, e.g. ``mel``).
        shape: its shape.
        dtype: its numpy dtype string, e.g. ``<f4``.
        offset: bytes from the start of the slot, a multiple of :data:`ALIGN`.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes the array takes."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def layout(arrays: Mapping[str, np.ndarray]) -> tuple[tuple[ArraySpec, ...], int]:
    """Lay arrays out one after the other in a slot, each at an offset aligned to :data:`ALIGN` bytes.

    Args:
        arrays: by name, numpy arrays of any shape and of a dtype without Python objects.

    Returns:
        The specs in the order of ``arrays``, and the bytes a slot needs to hold them all (0 for none).
    """
    specs, end = [], 0
    for key, array in arrays.items():
        offset = -(-end // ALIGN) * ALIGN
        specs.append(ArraySpec(key, tuple(array.shape), array.dtype.str, offset))
        end = offset + array.nbytes
    return tuple(specs), end


@dataclass(frozen=True)
class Credit:
    """The right to write slot ``index`` once: segment ``name`` of ``size`` bytes."""

    index: int
    name: str
    size: int


@dataclass(frozen=True)
class Placement:
    """What a producer's message says about the arrays of its batch.

    Attributes:
        slot: the slot the arrays were written to (``arrays`` says where); ``None``: they travel in the message.
        arrays: where each array lies in ``slot``; empty when ``slot`` is ``None``.
        need: bytes the arrays take in a slot: the trainer grows the ring's slots to at least this.
        returned: slots the producer gives back unwritten (smaller than ``need``).
    """

    slot: int | None = None
    arrays: tuple[ArraySpec, ...] = ()
    need: int = 0
    returned: tuple[int, ...] = ()


class SlotRing:
    """The trainer's side of one producer process's slots: creates, grows, reads, gives back and unlinks them.

    Args:
        count: slots in the ring, at most :data:`MAX_SLOTS`: the producer's queue depth + 2 (the messages in its
            queue, the slot it writes, a spare) lets it run ``depth`` batches ahead without waiting for a slot.
        size: bytes per slot to create them with right away (a replacement producer's ring takes its
            predecessor's size); 0 waits for the producer's first batch to say how large (:attr:`Placement.need`).

    Raises:
        ValueError: ``count`` is not in ``[1, MAX_SLOTS]``.

    Attributes:
        reader: the end of the credit pipe the producer reads (pass it to the producer process, to
            :class:`SlotWriter`).
        size: bytes per slot; 0 until known.
        broken: why slots could not be created (the producer then pickles every batch), or ``None``.
    """

    def __init__(self, count: int, size: int = 0) -> None:
        if not 1 <= count <= MAX_SLOTS:
            raise ValueError(f"a ring has 1 to {MAX_SLOTS} slots, not {count}")
        self.count = count
        self.size = 0
        self.broken: str | None = None
        self.reader, self._credits = multiprocessing.Pipe(duplex=False)
        self._segments: dict[int, SharedMemory] = {}
        self._finalizer = weakref.finalize(self, segments.release, self._segments, os.getpid())
        self.start(size)

    @property
    def names(self) -> list[str]:
        """The names of the ring's segments (in ``/dev/shm`` on Linux)."""
        return [shm.name for shm in self._segments.values()]

    def receive(self, placement: Placement, copy: bool = True) -> dict[str, np.ndarray] | None:
        """Take one message's placement: copy its arrays out of their slot, grow the ring to what it needs, give
        the producer back the slot and those it returned.

        Args:
            placement: from the producer's message.
            copy: copy the arrays out; ``False`` only frees the slot (a batch the trainer already has).

        Returns:
            The arrays by name, each a new array (a copy that never aliases the slot), or ``None`` when they
            travelled in the message or ``copy`` is false.

        Raises:
            ValueError: the placement names a slot the ring does not have, or arrays outside it (a bug).
        """
        try:
            if placement.slot is not None and copy:
                return self._read(placement.slot, placement.arrays)
            return None
        finally:
            given = [] if placement.slot is None else [placement.slot]
            if placement.need > self.size and self.broken is None:
                given = self._grow(placement.need, given)
            for index in (*given, *placement.returned):
                self._give(index)

    def start(self, size: int) -> None:
        """Create and give every slot, of ``size`` bytes (rounded up), if the ring has not started; otherwise, or
        when ``size`` is 0, nothing. A guess (another producer's batches) saves the producer's first request."""
        if self.size == 0 and size > 0 and self.broken is None:
            for index in self._grow(size):
                self._give(index)

    def close(self) -> None:
        """Unlink every segment and close the credit pipe; idempotent. Call it once the producer has stopped."""
        self._finalizer()
        self._credits.close()
        self.reader.close()

    def _grow(self, need: int, given: list[int] | None = None) -> list[int]:
        """Raise the slot size to fit ``need`` bytes; the slots to give: all of them when the ring starts."""
        if self.size == 0:
            self.size = segments.round_up(need)
            return list(range(self.count))
        self.size = segments.round_up(max(need, int(self.size * GROWTH)))
        return given or []

    def _give(self, index: int) -> None:
        """Send the producer a credit for slot ``index``, (re)created first if smaller than :attr:`size`."""
        if self.broken is not None:
            return
        shm = self._segments.get(index)
        if shm is None or shm.size < self.size:
            if shm is not None:
                segments.unlink(self._segments.pop(index))
            try:
                shm = self._segments[index] = segments.create(self.size)
            except OSError as exc:
                self.broken = f"cannot create a {self.size / 2**20:.1f} MiB shared-memory segment: {exc}"
                log.warning("%s; its producer pickles its batches instead (slower)", self.broken)
                self._credits.send(None)
                return
        self._credits.send(Credit(index, shm.name, shm.size))

    def _read(self, index: int, specs: tuple[ArraySpec, ...]) -> dict[str, np.ndarray]:
        shm = self._segments.get(index)
        if shm is None:
            raise ValueError(f"no slot {index} in the ring")
        out = {}
        for spec in specs:
            if spec.offset < 0 or spec.offset + spec.nbytes > shm.size:
                raise ValueError(f"array {spec.key!r} lies outside slot {index} ({shm.size} bytes)")
            view = np.ndarray(spec.shape, spec.dtype, buffer=shm.buf, offset=spec.offset)
            out[spec.key] = view.copy()
            del view  # a live view would keep the segment from closing
        return out


class SlotWriter:
    """A producer's side of its ring: the credits it holds and the segments it attached to.

    Args:
        reader: :attr:`SlotRing.reader` of the producer's ring.
    """

    def __init__(self, reader: Connection) -> None:
        self._reader = reader
        self._free: list[Credit] = []
        self._attached: dict[int, SharedMemory] = {}
        self._started = False  # a credit came: from now on, wait for a free slot rather than pickle
        self._broken = False  # the trainer cannot create slots: pickle every batch

    def place(self, arrays: Mapping[str, np.ndarray], stopped: Callable[[], bool]) -> Placement | None:
        """Write ``arrays`` into a free slot large enough, waiting for one if all are in use.

        Args:
            arrays: by name, numpy arrays of dtypes without Python objects.
            stopped: polled every 0.1 s while waiting for a free slot; true gives up.

        Returns:
            Where the arrays are; a placement without a slot when they must travel in the message (before the
            ring's first credit, or when every free slot is too small: those are returned); ``None`` when
            ``stopped()`` turned true while waiting.
        """
        specs, need = layout(arrays)
        if need == 0 or self._broken:
            return Placement()
        self._collect(0)
        while self._started and not self._free and not self._broken:
            if stopped():
                return None
            self._collect(0.1)
        if self._broken:
            return Placement()
        fit = next((c for c in self._free if c.size >= need), None)
        if fit is None:  # none yet (the trainer learns ``need`` from this message), or all too small
            returned = tuple(c.index for c in self._free)
            self._free.clear()
            return Placement(need=need, returned=returned)
        self._free.remove(fit)
        try:
            shm = self._attach(fit)
        except OSError as exc:  # /dev/shm is full, or the trainer unlinked the ring (it is stopping us)
            log.warning("cannot use a %.1f MiB shared-memory slot (%s); pickling batches instead (slower)",
                        fit.size / 2**20, exc)
            self._broken = True
            return Placement()
        for spec in specs:
            view = np.ndarray(spec.shape, spec.dtype, buffer=shm.buf, offset=spec.offset)
            np.copyto(view, arrays[spec.key], casting="no")
            del view
        return Placement(fit.index, specs, need)

    def close(self) -> None:
        """Detach from every segment (the trainer unlinks them)."""
        for shm in self._attached.values():
            with contextlib.suppress(BufferError):
                shm.close()
        self._attached.clear()

    def _collect(self, timeout: float) -> None:
        """Take the credits that came, waiting up to ``timeout`` seconds for the first."""
        try:
            while self._reader.poll(timeout):
                credit = self._reader.recv()
                timeout = 0
                if credit is None:
                    self._broken = True
                else:
                    self._started = True
                    self._free.append(credit)
        except (EOFError, OSError):
            # every write end of the credit pipe is closed: pickle from now on. This is not what stops a producer:
            # with ``fork`` a producer inherits the write end of its own ring, and each producer forked later those
            # of the earlier rings, so the trainer closing a ring gives no end-of-file here while any of them lives
            # (with spawn or forkserver it does). The stop event, polled while waiting for a slot (``stopped`` in
            # :meth:`place`) or to put a message, is what stops producers.
            self._broken = True

    def _attach(self, credit: Credit) -> SharedMemory:
        shm = self._attached.get(credit.index)
        if shm is None or shm.name != credit.name:  # a new slot, or one the trainer grew (a new segment)
            if shm is not None:
                shm.close()
                del self._attached[credit.index]
            shm = segments.attach(credit.name)
            try:
                segments.reserve(shm)
            except OSError:
                shm.close()
                raise
            self._attached[credit.index] = shm
        return shm
