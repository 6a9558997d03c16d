"""The multiprocess prefetcher: every batch exactly once, deterministic, resumable, and a producer that leaks
memory or dies is replaced without losing or repeating a batch; batches come through shared memory, whatever the
start method, and no segment is left behind."""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from pydantic import Field

from labswarm.config.experiment import ExperimentConfig
from labswarm.pipeline import (
    SKIPPED,
    Block,
    BlockConfig,
    Context,
    PipelineError,
    Prefetcher,
    register_block,
    segments,
    shm,
)
from labswarm.pipeline.prefetch import PrefetchConfig
from labswarm.pipeline.producer import produce
from labswarm.sample import iter_samples

ROOT = Path(__file__).resolve().parents[2]

#: What the leaking block keeps alive: in a producer process only (forked, so this list starts empty there).
_LEAKED: list[np.ndarray] = []


class LeakConfig(BlockConfig):
    """Parameters of the leaking test block."""

    mb: int = Field(25, ge=1)


@register_block
class Leak(Block):
    """A test block that leaks ``mb`` MiB (resident) per batch that passes through it."""

    name = "test_leak"
    config_model = LeakConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        for batch in items:
            if batch is not SKIPPED:
                _LEAKED.append(np.ones(self.config.mb * 2**20 // 8))
            yield batch


class ExplodeConfig(BlockConfig):
    """Parameters of the failing test block."""

    after: int = 1


@register_block
class Explode(Block):
    """A test block that raises after ``after`` batches."""

    name = "test_explode"
    config_model = ExplodeConfig

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        for n, batch in enumerate(items):
            if n == self.config.after:
                raise RuntimeError(f"boom in producer {ctx.producer}")
            yield batch


@register_block
class Unpicklable(Block):
    """A test block whose second batch cannot be pickled (it carries a lambda)."""

    name = "test_unpicklable"

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        for n, batch in enumerate(items):
            if n == 1 and batch is not SKIPPED:
                batch.failed.append(("?", lambda: "no pickle"))
            yield batch


@register_block
class Crash(Block):
    """A test block that kills its own process (producer 0) at its second batch, every time."""

    name = "test_crash"

    def __call__(self, items: Iterator[Any] | None, ctx: Context) -> Iterator[Any]:
        for n, batch in enumerate(items):
            if n >= 1 and batch is not SKIPPED and ctx.producer == 0:
                _flush_output()  # the batch before is in the pipe: the producer dies *at* batch 1
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch


def _flush_output() -> None:
    """In a producer: close its output queue and join the queue's feeder thread, which returns once every message
    put is written to the pipe (``multiprocessing.Queue.join_thread``). The queue is ``produce``'s ``out``, found
    up the stack (a block is not given it)."""
    frame = sys._getframe()
    while frame is not None and frame.f_code is not produce.__code__:
        frame = frame.f_back
    assert frame is not None, "not called from a producer's chain"
    out = frame.f_locals["out"]
    out.close()
    out.join_thread()


class Stalled(Exception):
    """What :func:`deadline` raises: not an ``OSError`` like ``TimeoutError``, which the prefetcher catches
    around its reads from a pipe."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: raise :class:`Stalled` in this (main) thread after ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise Stalled(f"the prefetcher made no progress within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _segments(pid: int | None = None) -> set[str]:
    """The shared-memory segments of process ``pid`` (this one by default) in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob(f"{segments.PREFIX}{segments.namespace()}_{pid or os.getpid()}_*")}


@pytest.fixture(autouse=True)
def no_segment_left() -> Iterator[None]:
    """Every test here leaves no shared-memory segment behind (closed, or garbage collected)."""
    before = _segments()
    yield
    gc.collect()
    assert _segments() - before == set()


def _blocks(*extra: dict, size: int = 2, frames: int | None = None) -> list[Block]:
    specs = [{"name": "source"}, {"name": "shuffle", "buffer": 100}, {"name": "features"},
             {"name": "batch", "size": size, "frames": frames}, *extra]
    return [Block.from_spec(s) for s in specs]


def _context(config: ExperimentConfig, **changes: Any) -> Context:
    return Context(experiment=config, classes=("high", "low"), **changes)


def _prefetch(**params: Any) -> PrefetchConfig:
    return PrefetchConfig(name="prefetch", **{"producers": 2, "depth": 2, **params})


def _epoch(blocks: list[Block], ctx: Context, config: PrefetchConfig, **kwargs: Any) -> list[list[str]]:
    with deadline(30), Prefetcher(blocks, ctx, config, **kwargs) as prefetcher:
        return [batch.ids for batch in prefetcher]


def _flat(batches: list[list[str]]) -> list[str]:
    return [i for ids in batches for i in ids]


def test_two_producers_deliver_every_sample_once_in_a_seeded_order(tones: ExperimentConfig) -> None:
    every = sorted(s.id for s in iter_samples(tones))
    ctx = _context(tones)
    first = _epoch(_blocks(), ctx, _prefetch())
    assert sorted(_flat(first)) == every and len(first) == 8
    assert _epoch(_blocks(), ctx, _prefetch()) == first  # however the producers are scheduled
    second = _epoch(_blocks(), ctx.with_(epoch=1), _prefetch())
    assert sorted(_flat(second)) == every and second != first
    assert sorted(_flat(_epoch(_blocks(), ctx, _prefetch(producers=3)))) == every
    in_process = _epoch(_blocks(), ctx, _prefetch(producers=0))
    assert sorted(_flat(in_process)) == every
    assert _epoch(_blocks(), ctx, _prefetch(producers=0)) == in_process


@pytest.mark.parametrize("producers", [0, 2])
def test_state_dict_resumes_mid_epoch(tones: ExperimentConfig, producers: int) -> None:
    ctx = _context(tones, epoch=3)
    whole = _epoch(_blocks(size=3), ctx, _prefetch(producers=producers))  # 6 batches, the last of one sample
    with deadline(30), Prefetcher(_blocks(size=3), ctx, _prefetch(producers=producers)) as prefetcher:
        head = [next(prefetcher).ids for _ in range(3)]
        state = prefetcher.state_dict()
    assert state["epoch"] == 3 and sum(state["delivered"]) == 3
    tail = _epoch(_blocks(size=3), ctx, _prefetch(producers=producers), state=state)
    assert head + tail == whole
    with pytest.raises(PipelineError, match="cannot resume"):
        Prefetcher(_blocks(), ctx.with_(epoch=4), _prefetch(producers=producers), state)


@pytest.mark.parametrize("producers", [0, 2])
def test_a_chain_of_samples_without_batches_resumes_too(tones: ExperimentConfig, producers: int) -> None:
    blocks = [Block.from_spec({"name": "source"}), Block.from_spec({"name": "shuffle"})]
    ctx = _context(tones)
    with deadline(30), Prefetcher(blocks, ctx, _prefetch(producers=producers)) as prefetcher:
        whole = [s.id for s in prefetcher]
    with deadline(30), Prefetcher(blocks, ctx, _prefetch(producers=producers)) as prefetcher:
        head = [next(prefetcher).id for _ in range(5)]
        state = prefetcher.state_dict()
    with deadline(30), Prefetcher(blocks, ctx, _prefetch(producers=producers), state) as prefetcher:
        tail = [s.id for s in prefetcher]
    assert head + tail == whole and sorted(whole) == sorted(s.id for s in iter_samples(tones))


def test_a_producer_that_raises_fails_the_epoch_with_its_traceback(tones: ExperimentConfig) -> None:
    blocks = _blocks({"name": "test_explode", "after": 1})
    with deadline(30), Prefetcher(blocks, _context(tones), _prefetch()) as p, pytest.raises(PipelineError) as info:
        list(p)
    message = str(info.value)
    assert "Traceback" in message and "RuntimeError: boom in producer" in message and "test_prefetch.py" in message


def test_a_batch_that_cannot_be_sent_fails_the_epoch(tones: ExperimentConfig) -> None:
    blocks = _blocks({"name": "test_unpicklable"})
    with deadline(30), Prefetcher(blocks, _context(tones), _prefetch()) as p, pytest.raises(PipelineError) as info:
        list(p)
    assert "batch 1 of producer 0 never came" in str(info.value)


def test_a_producer_that_dies_at_the_same_batch_again_fails_the_epoch(tones: ExperimentConfig) -> None:
    with deadline(30), Prefetcher(_blocks({"name": "test_crash"}), _context(tones), _prefetch()) as prefetcher:
        got = [next(prefetcher).ids for _ in range(2)]  # producer 0's first batch, then producer 1's
        with pytest.raises(PipelineError, match=r"producer 0 died 3 times at its batch 1 \(exit code -9\)"):
            next(prefetcher)
    assert len(got) == 2 and prefetcher.respawns == 2


def _until_full(slot: Any, timeout: float = 20.0) -> None:
    """Wait until producer ``slot``'s queue holds ``depth`` batches the trainer has not taken (the producer then
    blocks in its next put); fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not slot.queue.full():
        assert slot.process.is_alive(), f"producer {slot.index} exited ({slot.process.exitcode}) before it filled"
        assert time.monotonic() < deadline, f"producer {slot.index}'s queue did not fill within {timeout} s"
        time.sleep(0.01)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_close_stops_the_producers(tones: ExperimentConfig) -> None:
    before = _children()
    with deadline(30):
        prefetcher = Prefetcher(_blocks(size=1), _context(tones), _prefetch(depth=1))
        next(prefetcher)
        pids = {slot.process.pid for slot in prefetcher.slots}
        assert pids <= _children() - before  # running, with full queues
        prefetcher.close()
    assert _children() - before == set()
    assert all(not psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(StopIteration):
        next(prefetcher)
    prefetcher.close()  # idempotent


def test_watchdog_replaces_a_leaking_producer_without_losing_a_batch(tones: ExperimentConfig,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    ctx = _context(tones)
    # the reference epoch, and a producer's resident memory without the leak
    with deadline(30), Prefetcher(_blocks(size=1), ctx, _prefetch(memory_limit_mb=1e6, check_interval=0.01)) as p:
        reference = [batch.ids for batch in p]
        baseline = max(slot.memory_peak for slot in p.slots) / 2**20
    assert baseline > 0 and p.respawns == 0
    limit = baseline + 40  # two leaked batches (25 MiB each) pass it
    config = _prefetch(memory_limit_mb=limit, check_interval=0.01, grace=20)
    got, respawns = [], []
    caplog.set_level(logging.INFO, logger="labswarm.pipeline.prefetch")
    with deadline(30), Prefetcher(_blocks({"name": "test_leak", "mb": 25}, size=1), ctx, config) as prefetcher:
        for batch in prefetcher:
            got.append(batch.ids)
            respawns.append(prefetcher.respawns)
    assert respawns[-1] >= 1 and respawns[-2] >= 1  # replaced while the epoch went on
    assert Counter(_flat(got)) == Counter(_flat(reference)) and set(Counter(_flat(got)).values()) == {1}
    assert got == reference  # the very same order
    assert max(slot.spawned for slot in prefetcher.slots) >= 2
    replaced = [r.getMessage() for r in caplog.records if "replacing producer" in r.getMessage()]
    assert len(replaced) == prefetcher.respawns and all("it retired" in m for m in replaced)  # none killed


def test_a_retiring_producer_blocked_by_a_slow_trainer_is_not_killed(tones: ExperimentConfig,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    ctx = _context(tones)
    with deadline(30), Prefetcher(_blocks(size=1), ctx, _prefetch(memory_limit_mb=1e6, check_interval=0.01)) as p:
        baseline = max(slot.memory_peak for slot in p.slots) / 2**20
    # a producer retires after two leaked batches; a training step (0.3 s) is longer than the grace (0.1 s): a
    # retiring producer waits for the trainer to take its queued batches, which is no reason to kill it
    config = _prefetch(memory_limit_mb=baseline + 40, check_interval=0.01, grace=0.1)
    got = []
    caplog.set_level(logging.INFO, logger="labswarm.pipeline.prefetch")
    with deadline(30), Prefetcher(_blocks({"name": "test_leak", "mb": 25}, size=1), ctx, config) as prefetcher:
        for batch in prefetcher:
            got.append(batch.ids)
            time.sleep(0.3)  # the scenario, not a wait: a slow training step (see above)
    assert Counter(_flat(got)) == Counter(s.id for s in iter_samples(tones))  # every id, once
    replaced = [r.getMessage() for r in caplog.records if "replacing producer" in r.getMessage()]
    assert prefetcher.respawns >= 1 and len(replaced) == prefetcher.respawns
    assert all("it retired" in m for m in replaced), replaced  # none killed ("did not retire within 0.1 s")


def test_a_killed_producer_is_replaced_mid_epoch(tones: ExperimentConfig) -> None:
    # big batches (≈0.7 MB, more than a pipe holds): the killed producer's queue is likely to hold half a message
    blocks = _blocks(size=1, frames=4000)
    ctx = _context(tones)
    reference = _epoch(blocks, ctx, _prefetch())
    got = []
    with deadline(30), Prefetcher(blocks, ctx, _prefetch()) as prefetcher:
        got += [next(prefetcher).ids for _ in range(3)]
        victim = prefetcher.slots[1].process.pid
        _until_full(prefetcher.slots[1])  # its feeder thread blocks in the middle of a message (likely)
        os.kill(victim, signal.SIGKILL)
        got += [batch.ids for batch in prefetcher]
        assert prefetcher.respawns == 1 and prefetcher.slots[1].process.pid != victim
    assert got == reference


def test_batches_come_through_shared_memory_as_copies_of_the_right_arrays(tones: ExperimentConfig,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context(tones)
    reference = {}
    with deadline(30), Prefetcher(_blocks(), ctx, _prefetch(producers=0)) as prefetcher:
        for batch in prefetcher:
            for row, i in enumerate(batch.ids):
                reference[i] = {name: array[row] for name, array in batch.features.items()}
    placements = []
    receive = shm.SlotRing.receive

    def spy(ring: shm.SlotRing, placement: shm.Placement, copy: bool = True) -> Any:
        placements.append(placement)
        return receive(ring, placement, copy)

    monkeypatch.setattr(shm.SlotRing, "receive", spy)
    got = {}
    # batches of 1: 8 a producer (rings of 3 slots). A producer sends its batches in the message until the trainer's
    # first credit reaches it, which a loaded machine delays: with 4 batches a producer, only 3 of 8 went through a
    # slot once in CI; with 8 the bound below leaves 6 of each producer's batches to that race
    with deadline(30), Prefetcher(_blocks(size=1), ctx, _prefetch(depth=1)) as prefetcher:
        for batch in prefetcher:
            assert batch.labels.dtype == np.int64 and len(batch.labels) == len(batch.ids) == 1 and batch.failed == []
            for name, array in batch.features.items():
                # copied out of a slot, or unpickled (the first ones): never a view of a slot
                assert (array.flags.owndata or isinstance(array.base, bytes)) and array.dtype == np.float32
                for row, i in enumerate(batch.ids):
                    got.setdefault(i, {})[name] = array[row]
        sizes = [slot.ring.size for slot in prefetcher.slots]
    assert got.keys() == reference.keys() and all(reference[i].keys() == {"mel", "mfcc"} for i in got)
    assert all(np.array_equal(got[i][name], reference[i][name]) for i in got for name in reference[i])
    assert all(size > 0 for size in sizes) and sum(p.slot is not None for p in placements) >= 4


needs_dev_shm = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="lists the segments in /dev/shm (Linux)")


@needs_dev_shm
def test_a_killed_producers_ring_is_unlinked_and_its_replacement_gets_a_new_one(tones: ExperimentConfig) -> None:
    blocks = _blocks(size=1, frames=4000)
    ctx = _context(tones)
    reference = _epoch(blocks, ctx, _prefetch())
    with deadline(30), Prefetcher(blocks, ctx, _prefetch()) as prefetcher:
        got = [next(prefetcher).ids for _ in range(3)]
        victim, old = prefetcher.slots[1].process.pid, set(prefetcher.slots[1].ring.names)
        assert old and old <= _segments()
        _until_full(prefetcher.slots[1])  # and every free slot of its ring
        os.kill(victim, signal.SIGKILL)
        while not prefetcher.respawns:
            got.append(next(prefetcher).ids)
        new = set(prefetcher.slots[1].ring.names)
        assert new and not new & old and not old & _segments()  # the new one at once: the old one's size
        got += [batch.ids for batch in prefetcher]
        assert prefetcher.respawns == 1
    assert got == reference
    assert not (old | new) & _segments()


@needs_dev_shm
def test_an_unclosed_prefetcher_unlinks_its_segments_when_garbage_collected(tones: ExperimentConfig) -> None:
    with deadline(30):
        prefetcher = Prefetcher(_blocks(size=1), _context(tones), _prefetch())
        next(prefetcher)
        next(prefetcher)
    # a batch of each producer was received: the trainer, which alone creates segments, sized both rings then
    names = {name for slot in prefetcher.slots for name in slot.ring.names}
    assert all(slot.ring.names for slot in prefetcher.slots) and names <= _segments()
    del prefetcher
    gc.collect()
    assert not names & _segments()


#: Run in a fresh interpreter (its resource tracker stops when it exits and would complain there): an epoch per
#: start method, a producer killed mid-epoch in each.
SCENARIO = """
import json, os, pickle, signal, sys
from labswarm.pipeline import Prefetcher
from labswarm.pipeline.prefetch import PrefetchConfig
from labswarm.pipeline.producer import produce

if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        blocks, ctx = pickle.load(f)
    epochs = {}
    for method in ("fork", "spawn", "forkserver"):
        config = PrefetchConfig(name="prefetch", producers=2, depth=2, start_method=method)
        with Prefetcher(blocks, ctx, config) as prefetcher:
            ids = [next(prefetcher).ids for _ in range(3)]
            os.kill(prefetcher.slots[1].process.pid, signal.SIGKILL)
            ids += [batch.ids for batch in prefetcher]
        epochs[method] = [ids, prefetcher.respawns]
    print(json.dumps(epochs))
"""


@pytest.mark.slow
@needs_dev_shm
def test_every_start_method_works_and_leaves_no_segment_nor_tracker_warning(tones: ExperimentConfig,
                                                                             tmp_path: Path) -> None:
    blocks, ctx = _blocks(size=1, frames=4000), _context(tones)
    reference = _epoch(blocks, ctx, _prefetch())
    (tmp_path / "scenario.py").write_text(SCENARIO)
    with open(tmp_path / "chain.pkl", "wb") as f:
        pickle.dump((blocks, ctx), f)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, str(tmp_path / "scenario.py"), str(tmp_path / "chain.pkl")], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as child:
        try:  # read to the end: the child's resource tracker, which writes its warnings to the same stderr, is done
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # a hung scenario: its whole group goes (its producers hold the pipes)
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
            pytest.fail(f"the scenario hung for 120 s; its output: {out[-2000:]} {err[-2000:]}")
    assert child.returncode == 0, err
    epochs = json.loads(out)
    for method, (ids, respawns) in epochs.items():
        assert ids == reference and respawns == 1, method
    assert "resource_tracker" not in err and "leaked" not in err and "Traceback" not in err, err
    assert _segments(child.pid) == set()


def test_a_resumed_epoch_whose_other_producer_is_done_starts_only_the_ring_it_needs(tones: ExperimentConfig) -> None:
    ctx = _context(tones)
    whole = _epoch(_blocks(size=3), ctx, _prefetch())  # producer 0: batches 0, 2, 4; producer 1: 1, 3, 5
    state = {"epoch": 0, "producers": 2, "delivered": [3, 2], "done": [True, False], "turn": 1}
    with deadline(30), Prefetcher(_blocks(size=3), ctx, _prefetch(), state) as prefetcher:
        assert prefetcher.slots[0].ring is None
        assert [batch.ids for batch in prefetcher] == whole[5:]
