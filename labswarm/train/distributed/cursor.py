"""The global cursor: hands each learner mutually exclusive chunks of every pass over the training split (DLaaS).

A pass over ``n_samples`` training samples is a seeded permutation of them cut into chunks of ``chunk_size``.
Learners **claim** a chunk atomically and hold a **lease** on it (``lease_s``); when they have trained on it they
mark it **done**; a learner that stops (a halt) between claiming a chunk and training it **releases** it, free
again for anyone. A learner that dies stops renewing: once its lease expires, the next learner that finds the
fresh chunks exhausted takes the expired one over. A pass is complete when every chunk is done, and every
sample was then trained on exactly once in that pass, whatever learners died or restarted
(``tests/learners/test_cursor.py`` counts).

Backing: the job's rendezvous :class:`torch.distributed.TCPStore`, hosted by the coordinator (the lifecycle
manager), under the prefix ``labswarm/cursor``. Why the store and not a service of our own: it is already
there for every distributed job (the process group rendezvous), it gives the two atomic operations a cursor
needs (``add``: fetch-and-add, ~25 µs on loopback, hands out fresh chunks without contention; ``compare_set``:
exclusive claim, lease takeover and done, each a single atomic step), and it is torch's, so learners need no
extra client. What it lacks is persistence: the coordinator checkpoints :meth:`GlobalCursor.state_dict` with
the job and, after a restart, writes it back into the new store with :meth:`GlobalCursor.load_state_dict`.

A chunk's value in the store: absent (free), ``L|<owner>|<n>|<deadline>`` (the owner's ``n``-th lease, until a
Unix time in s), or ``D|<owner>`` (done). Deadlines are wall-clock times of the claiming host: learners on
several hosts need clocks in step to well under ``lease_s`` (NTP).

Semantics of a lost lease: :meth:`GlobalCursor.done` of a learner whose lease expired and was taken over
returns ``False``: its work on the chunk does not count for the pass (the new holder trains it). With a
synchronous framework such a learner has been declared dead and the learners restart together from the last
checkpoint, which holds the cursor's state of the same moment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from labswarm.errors import ConfigError, LabswarmError

#: Store prefix of the cursor's keys.
PREFIX = "labswarm/cursor"
#: Longest wait between two looks at the leases while every remaining chunk is held by someone else, in s.
MAX_POLL_S = 0.2


class CursorError(LabswarmError):
    """The cursor could not hand out a chunk in time (every remaining chunk held by live leases), or its store
    failed."""


@dataclass(frozen=True)
class Chunk:
    """A claimed chunk.

    Attributes:
        pass_: the pass, from 0.
        index: the chunk's index in the pass, from 0.
        samples: the training-split sample indices of the chunk, int64 ``(≤ chunk_size,)``.
        lease: the store value of this claim (owner and deadline); :meth:`GlobalCursor.done` and
            :meth:`GlobalCursor.renew` need it.
    """

    pass_: int
    index: int
    samples: np.ndarray
    lease: str


class GlobalCursor:
    """A client of the global cursor; every learner (and the coordinator) makes its own on the shared store.

    Args:
        store: a ``torch.distributed.TCPStore`` (client or server) shared by the job.
        n_samples: samples in the training split.
        chunk_size: samples per chunk (the last chunk of a pass may be shorter).
        owner: who claims (a learner's ``rank:attempt:pid:token``, :func:`~labswarm.train.distributed.record.owner`),
            recorded in leases and done marks.
        lease_s: how long a claim holds without a renewal, in s (default 30: longer than a chunk's training).
        seed: the seed of each pass's permutation (the training seed: ``ExperimentConfig.training_seed``).

    Raises:
        ConfigError: a non-positive ``n_samples``, ``chunk_size`` or ``lease_s``, or an ``owner`` with ``|``.
    """

    def __init__(self, store: Any, n_samples: int, chunk_size: int, owner: str, lease_s: float = 30.0,
                 seed: int = 0) -> None:
        for name, value in (("n_samples", n_samples), ("chunk_size", chunk_size), ("lease_s", lease_s)):
            if value <= 0:
                raise ConfigError([(f"cursor.{name}", f"must be positive, got {value}")])
        if "|" in owner:
            raise ConfigError([("cursor.owner", f"must not contain '|', got {owner!r}")])
        self.store, self.owner, self.lease_s, self.seed = store, owner, float(lease_s), int(seed)
        self.n_samples, self.chunk_size = int(n_samples), int(chunk_size)
        self.n_chunks = -(-self.n_samples // self.chunk_size)
        self._orders: dict[int, np.ndarray] = {}
        self._known_pass = -1
        self._leases = 0

    def _key(self, pass_: int, index: int | str) -> str:
        return f"{PREFIX}/{pass_}/{index}"

    def order(self, pass_: int) -> np.ndarray:
        """The pass's permutation of the sample indices, int64 ``(n_samples,)`` (the same on every learner)."""
        if pass_ not in self._orders:
            self._orders = {pass_: np.random.default_rng((self.seed, pass_)).permutation(self.n_samples)}
        return self._orders[pass_]

    def _chunk(self, pass_: int, index: int, lease: str) -> Chunk:
        samples = self.order(pass_)[index * self.chunk_size:(index + 1) * self.chunk_size]
        return Chunk(pass_, index, samples, lease)

    def _new_lease(self) -> str:
        self._leases += 1  # unique even within one clock tick: a renewal always changes the value
        return f"L|{self.owner}|{self._leases}|{time.time() + self.lease_s:.3f}"

    def _call(self, method: str, *args: Any) -> Any:
        """``self.store.<method>(*args)``; the store's errors (DistStoreError, DistNetworkError, RuntimeError)
        become :class:`CursorError`."""
        try:
            return getattr(self.store, method)(*args)
        except Exception as exc:
            raise CursorError(f"the cursor's store failed: {exc}") from exc

    def _add(self, key: str) -> int:
        """Atomic fetch-and-add of 1; the value after it."""
        return int(self._call("add", key, 1))

    def _swap(self, key: str, expected: str, desired: str) -> tuple[bool, str]:
        """Atomic compare-and-set; ``(swapped, the value now)``."""
        now = self._call("compare_set", key, expected, desired).decode()
        return now == desired, now

    def _claim_next(self, pass_: int) -> Chunk | None:
        """Claim the next chunk of ``pass_`` that the counter hands out, or ``None`` once the counter is past the
        last chunk: fetch-and-add gives each index to one learner; an index taken already (restored as done or
        leased from a checkpoint, or reclaimed by a scan) is skipped."""
        self._note_pass(pass_)
        while True:
            index = self._add(self._key(pass_, "next")) - 1
            if index >= self.n_chunks:
                return None
            lease = self._new_lease()
            if self._swap(self._key(pass_, index), "", lease)[0]:
                return self._chunk(pass_, index, lease)

    def claim(self, pass_: int, timeout_s: float = 300.0) -> Chunk | None:
        """Claim a chunk of ``pass_``: a fresh one while any is left, else one whose lease expired; wait while
        every remaining chunk is held by a live lease.

        Returns:
            The claimed :class:`Chunk`, or ``None`` when every chunk of the pass is done.

        Raises:
            CursorError: no chunk came free within ``timeout_s`` seconds, or the store failed.
        """
        if (chunk := self._claim_next(pass_)) is not None:
            return chunk
        deadline, wait = time.monotonic() + timeout_s, 0.01
        while True:
            held = False
            for index in range(self.n_chunks):  # each look is one atomic compare_set: claims a free chunk
                lease = self._new_lease()
                swapped, now = self._swap(self._key(pass_, index), "", lease)
                if swapped:  # an index whose fetch-and-add winner died before claiming it
                    return self._chunk(pass_, index, lease)
                if now.startswith("L|"):
                    if float(now.rsplit("|", 1)[1]) < time.time():
                        lease = self._new_lease()
                        if self._swap(self._key(pass_, index), now, lease)[0]:
                            return self._chunk(pass_, index, lease)
                    held = True
            if not held:
                return None
            if time.monotonic() > deadline:
                raise CursorError(f"pass {pass_}: no chunk came free within {timeout_s} s (all held by leases)")
            time.sleep(wait)  # waiting on other learners' leases: nothing to be notified by
            wait = min(2 * wait, MAX_POLL_S)

    def claim_fresh(self, pass_: int) -> Chunk | None:
        """Claim a chunk of ``pass_`` that nobody has claimed yet, without waiting for other learners' leases
        (synchronous frameworks: learners claim in lockstep, one chunk each per step, and a learner that waited
        for a peer's lease inside a step would deadlock with that peer's collective).

        Returns:
            The claimed :class:`Chunk` (a chunk never claimed, or one given back with :meth:`release`), or
            ``None`` when no free chunk is left in the pass.

        Raises:
            CursorError: the store failed.
        """
        if (chunk := self._claim_next(pass_)) is not None:
            return chunk
        if not self._call("check", [self._key(pass_, "released")]):
            return None
        for index in range(self.n_chunks):  # chunks given back (a halt): free again, past the counter
            lease = self._new_lease()
            if self._swap(self._key(pass_, index), "", lease)[0]:
                return self._chunk(pass_, index, lease)
        return None

    def claim_orphan(self, pass_: int, heir_of: str) -> Chunk | None:
        """Without waiting, take over a chunk of ``pass_`` whose holder is gone: a lease that expired, or one
        held by a predecessor (an owner starting with ``heir_of``, a learner's ``"<rank>:"``, other than this
        client: the process this one replaced after a kill); also a free chunk past the counter. For worker groups
        that claim in lockstep inside the group (:meth:`claim_fresh` first): a restarted group takes its dead
        predecessors' chunks at once, and a live lease of another group is never waited for.

        Returns:
            The claimed :class:`Chunk`, or ``None`` when no chunk of the pass is free or orphaned.

        Raises:
            CursorError: the store failed.
        """
        for index, now in enumerate(self.chunk_states(pass_)):
            if now.startswith("D|"):
                continue
            if now.startswith("L|"):
                holder, deadline = now.split("|")[1], float(now.rsplit("|", 1)[1])
                if deadline >= time.time() and not (holder.startswith(heir_of) and holder != self.owner):
                    continue
            lease = self._new_lease()
            if self._swap(self._key(pass_, index), now, lease)[0]:
                return self._chunk(pass_, index, lease)
        return None

    def renew(self, chunk: Chunk) -> Chunk | None:
        """Extend a lease by ``lease_s`` from now (call it well within ``lease_s`` while training a chunk).

        Returns:
            The chunk with its new lease, or ``None`` when the lease was lost (expired and taken over).
        """
        lease = self._new_lease()
        swapped, _ = self._swap(self._key(chunk.pass_, chunk.index), chunk.lease, lease)
        return Chunk(chunk.pass_, chunk.index, chunk.samples, lease) if swapped else None

    def release(self, chunk: Chunk) -> bool:
        """Give a claimed chunk back untrained (a halt between claim and training): it is free again, for
        :meth:`claim` and :meth:`claim_fresh` of any learner, and free in :meth:`state_dict`.

        Returns:
            ``True``; ``False`` when the lease was lost already (the chunk is someone else's).

        Raises:
            CursorError: the store failed.
        """
        key = self._key(chunk.pass_, chunk.index)
        # first whether the lease is still this one (a swap to "" alone reads "" back from a free chunk too)
        released = self._swap(key, chunk.lease, chunk.lease)[0] and self._swap(key, chunk.lease, "")[0]
        if released:
            self._add(self._key(chunk.pass_, "released"))  # claim_fresh scans for free chunks past the counter
        return released

    def done(self, chunk: Chunk) -> bool:
        """Mark a chunk trained.

        Returns:
            ``True``; ``False`` when the lease was lost: the chunk's work does not count (another learner has it).
        """
        return self._swap(self._key(chunk.pass_, chunk.index), chunk.lease, f"D|{self.owner}")[0]

    def _note_pass(self, pass_: int) -> None:
        """Record the highest pass touched (for :meth:`state_dict`), once per new pass per client."""
        if pass_ <= self._known_pass:
            return
        key, current = f"{PREFIX}/passes", ""
        while True:
            swapped, now = self._swap(key, current, str(pass_ + 1))
            if swapped or int(now or 0) >= pass_ + 1:
                break
            current = now
        self._known_pass = pass_

    def _value(self, key: str) -> str:
        return self._call("get", key).decode() if self._call("check", [key]) else ""

    def chunk_states(self, pass_: int) -> list[str]:
        """The store value of every chunk of ``pass_`` (``""`` free, ``L|owner|n|deadline``, ``D|owner``)."""
        return [self._value(self._key(pass_, i)) for i in range(self.n_chunks)]

    def state_dict(self) -> dict[str, Any]:
        """The cursor's whole state, for the job's checkpoint: the layout and every touched pass's chunk values.

        Raises:
            CursorError: the store failed.
        """
        passes = int(self._value(f"{PREFIX}/passes") or 0)
        return {"n_samples": self.n_samples, "chunk_size": self.chunk_size, "seed": self.seed,
                "passes": {p: self.chunk_states(p) for p in range(passes)}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Write a :meth:`state_dict` into this cursor's store (a fresh one: the coordinator restarted). Done
        chunks stay done; leases are restored as they were, so a live holder can still mark its chunk done and a
        dead one's expires.

        Raises:
            ConfigError: the state is of another layout (sample count, chunk size or seed).
            CursorError: the store failed.
        """
        for name in ("n_samples", "chunk_size", "seed"):
            if int(state[name]) != getattr(self, name):
                raise ConfigError([(f"cursor.{name}", f"the checkpoint has {state[name]}, "
                                                      f"this cursor {getattr(self, name)}")])
        passes = {int(p): values for p, values in state["passes"].items()}
        for pass_, values in passes.items():
            for index, value in enumerate(values):
                if value:
                    self._call("set", self._key(pass_, index), value)
        if passes:
            self._note_pass(max(passes))
