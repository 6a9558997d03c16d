"""Calls of the event loop run in threads of their own, each result handed back with one wake-up of the loop.

The prediction endpoint hands each upload to a thread (its duration checked, then computed there or sent to a
feature worker) and awaits the outcome. :meth:`asyncio.loop.run_in_executor` does this through a
:class:`~concurrent.futures.ThreadPoolExecutor`: its ``submit`` wakes a thread and then keeps the interpreter's
lock for its own bookkeeping and the future's wrapping, so the woken thread waits for the lock it needs (on the
loaded 2-core machine the event loop was seen there ~0.65 ms a request, py-spy, load 17); and a result that is
itself a future (a file sent to a worker) wakes the loop twice, once for the thread's return and once more for
the file. Here the hand-over is the last thing the loop does (a put on the queue the threads wait on) and a thread
resolves the loop's future once, through :meth:`~asyncio.loop.call_soon_threadsafe`, when the outcome is known
(a round trip to an idle thread and back, 10-ms job: 0.09 ms against 0.20 ms with ``run_in_executor``, uvloop,
2026-11-26, load 15: docs/benchmarks/training.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...], list[Any]]


class Handoff:
    """``threads`` threads running calls handed over by an event loop.

    Args:
        threads: threads (at least 1), started on the first call.
        name: their names' start.
    """

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"threads: at least 1, got {threads}")
        self.threads = threads
        self.name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started: list[threading.Thread] = []
        self._closed = False

    def settle(self, fn: Callable[..., Future[T]], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` in a thread; call on the event loop. ``fn`` returns a
        :class:`concurrent.futures.Future`: the returned future gives its result or exception once it is done
        (at once if ``fn`` returned it done), or ``fn``'s own exception. Cancelling the returned future (the
        request went away) cancels ``fn``'s future, or skips ``fn`` if it has not started.

        Raises:
            RuntimeError: the threads were closed.
        """
        loop = asyncio.get_running_loop()
        out: asyncio.Future[T] = loop.create_future()
        inner: list[Any] = []  # fn's future, once a thread has it
        out.add_done_callback(lambda done: done.cancelled() and inner and inner[0].cancel())
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: closed")
            if not self._started:
                self._start()
            self._queue.put((loop, out, fn, args, inner))  # the last step: the thread finds the loop done with it
        return out

    def _start(self) -> None:
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, name=f"{self.name}_{i}", daemon=True)
            thread.start()
            self._started.append(thread)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, out, fn, args, inner = item
            if self._closed:  # closed with calls still queued: none runs, each request sees it cancelled
                _call(loop, out.cancel)
                continue
            if out.cancelled():  # the request went away before its turn (a read of the loop's future: benign)
                continue
            try:
                done = fn(*args)
                inner.append(done)
                if out.cancelled():
                    done.cancel()
                done.add_done_callback(lambda finished, loop=loop, out=out: _call(loop, _copy, out, finished))
            except BaseException as exc:  # handed to the awaiting request; the thread goes on
                _call(loop, _fail, out, exc)
        self._queue.put(None)  # for the next thread

    def close(self) -> None:
        """Stop the threads: a call in progress finishes, the calls still queued are cancelled (their futures
        cancelled), later :meth:`settle` calls raise."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads to end (after :meth:`close`)."""
        for thread in self._started:
            thread.join(timeout)


def _call(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile: nobody awaits it any more
        loop.call_soon_threadsafe(callback, *args)


def _fail(out: asyncio.Future[Any], exc: BaseException) -> None:
    if not out.done():
        out.set_exception(exc)


def _copy(out: asyncio.Future[Any], done: Future[Any]) -> None:
    if out.done():
        return
    if done.cancelled():
        out.cancel()
    elif done.exception() is not None:
        out.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        out.set_result(done.result())
