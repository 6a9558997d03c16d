"""labswarm.serve.handoff: calls run in the hand-off threads, their outcomes back on the loop, cancels and close."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from labswarm.serve.handoff import Handoff


def _done(value: object) -> Future[object]:
    done: Future[object] = Future()
    done.set_result(value)
    return done


async def _until(condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_outcomes_cancels_and_close_reach_the_loop() -> None:
    handoff = Handoff(2, "test-handoff")

    async def scenario() -> None:
        loop_thread = threading.current_thread()
        ran_in: list[threading.Thread] = []

        def computed(value: int) -> Future[object]:  # done in the thread: the lone file's case
            ran_in.append(threading.current_thread())
            return _done(value * 2)

        assert await handoff.settle(computed, 21) == 42
        assert ran_in and ran_in[0] is not loop_thread and ran_in[0].name.startswith("test-handoff")

        later: Future[object] = Future()  # done elsewhere afterwards: a file sent to a worker
        waiting = handoff.settle(lambda: later)
        await asyncio.sleep(0.05)
        assert not waiting.done()  # not before the worker's future
        threading.Thread(target=later.set_result, args=("from a worker",)).start()
        assert await waiting == "from a worker"

        def failing() -> Future[object]:
            raise ValueError("not decodable")

        with pytest.raises(ValueError, match="not decodable"):
            await handoff.settle(failing)
        failed: Future[object] = Future()
        failed.set_exception(KeyError("the worker's error"))
        with pytest.raises(KeyError):
            await handoff.settle(lambda: failed)

        pending: Future[object] = Future()  # the request goes away: the thread's future is cancelled too
        took = threading.Event()

        def hand_over() -> Future[object]:
            took.set()
            return pending

        gone = handoff.settle(hand_over)
        await _until(took.is_set)
        gone.cancel()
        await _until(pending.cancelled)

        release, started = threading.Event(), threading.Semaphore(0)

        def blocking() -> Future[object]:
            started.release()
            return _done(release.wait(30))

        busy = [handoff.settle(blocking) for _ in range(2)]  # both threads busy, a third call queued, then closed
        queued = handoff.settle(lambda: _done("never"))
        await _until(lambda: started.acquire(blocking=False))
        await _until(lambda: started.acquire(blocking=False))
        handoff.close()
        release.set()
        assert await asyncio.gather(*busy) == [True, True]
        with pytest.raises(asyncio.CancelledError):
            await queued
        with pytest.raises(RuntimeError, match="closed"):
            handoff.settle(lambda: _done(None))

    asyncio.run(scenario())
    handoff.join(10)
    assert not any(thread.is_alive() for thread in handoff._started)
