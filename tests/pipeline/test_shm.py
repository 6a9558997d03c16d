"""The ring of shared-memory slots, both sides in this process: sizing from the first request, copies that never
alias a slot, growth, waiting for a free slot, falling back to pickling, and no segment left behind."""

from __future__ import annotations

import errno
import gc
import itertools
import logging
import os
import subprocess
import sys
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np
import pytest

from labswarm.pipeline import segments as shm_segments
from labswarm.pipeline.segments import GRAIN
from labswarm.pipeline.shm import ALIGN, GROWTH, Placement, SlotRing, SlotWriter, layout

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory in /dev/shm (Linux)")


def segments() -> set[str]:
    """This process's segments in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob(f"{shm_segments.PREFIX}{shm_segments.namespace()}_{os.getpid()}_*")}


@pytest.fixture(autouse=True)
def no_segment_left():
    before = segments()
    yield
    gc.collect()
    assert segments() - before == set()


def batch(frames: int = 50, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"mel": rng.standard_normal((4, 32, frames)).astype(np.float32),
            "mfcc": rng.standard_normal((4, 13, frames - 1)).astype(np.float32),
            "flags": np.arange(3, dtype=np.int64)}


def never() -> bool:
    return False


def test_layout_aligns_every_array() -> None:
    arrays = batch()
    specs, need = layout(arrays)
    assert [s.key for s in specs] == ["mel", "mfcc", "flags"]
    assert all(s.offset % ALIGN == 0 for s in specs) and specs[0].offset == 0
    assert all(a.offset + a.nbytes <= b.offset for a, b in itertools.pairwise(specs))
    assert need == specs[-1].offset + 3 * 8 and specs[1].dtype == "<f4"
    assert layout({}) == ((), 0)


def test_the_first_batch_sizes_the_ring_then_batches_go_through_slots_as_copies() -> None:
    ring = SlotRing(3)
    writer = SlotWriter(ring.reader)
    try:
        first = writer.place(batch(), never)
        assert first.slot is None and first.need == layout(batch())[1] and ring.size == 0
        assert ring.receive(first) is None  # the arrays came pickled; now the ring exists
        assert ring.size == GRAIN and len(ring.names) == 3 and set(ring.names) <= segments()
        got = []
        for seed in range(7):  # more batches than slots: each slot is written again
            placement = writer.place(batch(seed=seed), never)
            assert placement.slot is not None and placement.returned == ()
            arrays = ring.receive(placement)
            assert all(a.flags.owndata for a in arrays.values())  # never a view of the slot
            got.append(arrays)
        for seed, arrays in enumerate(got):
            expected = batch(seed=seed)
            assert arrays.keys() == expected.keys()
            assert all(np.array_equal(arrays[k], expected[k]) and arrays[k].dtype == expected[k].dtype
                       for k in expected)
    finally:
        writer.close()
        ring.close()


def test_a_larger_batch_returns_the_small_slots_and_grows_the_ring() -> None:
    ring = SlotRing(2)
    writer = SlotWriter(ring.reader)
    try:
        ring.receive(writer.place(batch(), never))
        small, names = ring.size, set(ring.names)
        big = batch(frames=3000)  # ~1.8 MB
        placement = writer.place(big, never)
        assert placement.slot is None and sorted(placement.returned) == [0, 1] and placement.need > small
        ring.receive(placement)
        assert ring.size >= max(placement.need, GROWTH * small) and ring.size % GRAIN == 0
        assert not names & set(ring.names) and not names & segments()  # the small segments are unlinked
        placement = writer.place(big, never)
        assert placement.slot is not None
        assert np.array_equal(ring.receive(placement)["mel"], big["mel"])
        placement = writer.place(batch(), never)  # a smaller one fits a grown slot
        assert placement.slot is not None and ring.receive(placement)["mfcc"].shape == (4, 13, 49)
    finally:
        writer.close()
        ring.close()


def test_a_replacement_ring_starts_at_its_predecessors_size_and_a_replay_only_frees_its_slot() -> None:
    ring = SlotRing(1, size=3 * GRAIN - 5)
    writer = SlotWriter(ring.reader)
    try:
        assert ring.size == 3 * GRAIN and len(ring.names) == 1
        placement = writer.place(batch(), never)
        assert placement.slot == 0
        assert ring.receive(placement, copy=False) is None  # not copied, but the slot is free again
        assert writer.place(batch(), never).slot == 0
    finally:
        writer.close()
        ring.close()


def test_the_writer_waits_for_a_free_slot_and_gives_up_when_stopped() -> None:
    ring = SlotRing(1)
    writer = SlotWriter(ring.reader)
    try:
        ring.receive(writer.place(batch(), never))
        held = writer.place(batch(), never)
        assert held.slot == 0
        polls = []

        def stopped() -> bool:
            polls.append(1)
            return len(polls) > 2

        assert writer.place(batch(), stopped) is None and len(polls) == 3  # waited ~0.2 s, then gave up
        ring.receive(held)
        assert writer.place(batch(), never).slot == 0
    finally:
        writer.close()
        ring.close()


def test_a_ring_that_cannot_create_slots_makes_its_producer_pickle(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    def full(size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_segments, "create", full)
    ring = SlotRing(2)
    writer = SlotWriter(ring.reader)
    try:
        with caplog.at_level(logging.WARNING, logger="labswarm.pipeline.shm"):
            ring.receive(writer.place(batch(), never))
        assert ring.broken and "No space left" in caplog.text and "pickles its batches" in caplog.text
        for _ in range(3):  # no wait, no slot: every batch travels in its message
            assert writer.place(batch(), never) == Placement()
    finally:
        writer.close()
        ring.close()


def test_a_producer_that_cannot_reserve_a_slot_pickles_from_then_on(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    def full(segment: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_segments, "reserve", full)
    ring = SlotRing(2)
    writer = SlotWriter(ring.reader)
    try:
        ring.receive(writer.place(batch(), never))
        with caplog.at_level(logging.WARNING, logger="labswarm.pipeline.shm"):
            assert writer.place(batch(), never) == Placement()  # not SIGBUS while writing: pickled
        assert "No space left" in caplog.text and "pickling batches" in caplog.text
        assert writer.place(batch(), lambda: pytest.fail("waited for a slot")) == Placement()
    finally:
        writer.close()
        ring.close()


def test_only_the_trainer_registers_segments_with_the_resource_tracker(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[str] = []
    register = resource_tracker.register
    monkeypatch.setattr(resource_tracker, "register",
                        lambda name, rtype: (registered.append(name.lstrip("/")), register(name, rtype)))
    ring = SlotRing(2)
    writer = SlotWriter(ring.reader)
    try:
        ring.receive(writer.place(batch(), never))
        assert sorted(registered) == sorted(ring.names)  # created here, so unlinked if this process is killed
        registered.clear()
        assert ring.receive(writer.place(batch(), never)) is not None  # the writer attached to a slot
        assert registered == []  # without registering it: a producer must never unlink the trainer's slots
    finally:
        writer.close()
        ring.close()
    assert resource_tracker.register is not register  # still the test's spy: _untracked restored it


def test_close_and_garbage_collection_unlink_every_segment() -> None:
    ring = SlotRing(2, size=GRAIN)
    names = set(ring.names)
    assert len(names) == 2 and names <= segments()
    ring.close()
    assert not names & segments()
    ring.close()  # idempotent
    ring = SlotRing(2, size=GRAIN)
    names = set(ring.names)
    del ring
    gc.collect()
    assert not names & segments()


def test_sweep_removes_what_dead_trainers_of_this_namespace_left(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    names = {
        "dead": f"{shm_segments.PREFIX}{shm_segments.namespace()}_{dead_pid}_feed",
        "alive": f"{shm_segments.PREFIX}{shm_segments.namespace()}_{os.getpid()}_feed",
        "other namespace": f"{shm_segments.PREFIX}ffff0000_{dead_pid}_feed",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert shm_segments.sweep_stale(str(tmp_path)) == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["alive"], names["other namespace"]])
