"""The health controller of ``labswarm run``: its loop in a thread of this process, steering the run's own
session, and the session's health figure at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labswarm.health.loop import HealthLoop
    from labswarm.sessions.service import SessionService


class HealthThread:
    """The health controller's loop in a thread of this process (``labswarm run`` steers its own session).

    Args:
        manager_url: the manager.
        token: its API token.
        rabbitmq_api: the RabbitMQ management API, or ``None`` to take depth from the ledger.
        consumers: worker processes (ledger mode).
        log_dir: where decisions are logged.
        service: the sessions of the run's own manager (``app.state.sessions``) when it runs in this process: the
            loop reads and steers them in-process (:class:`~labswarm.run.direct.ServiceMonitor`), not over HTTP.
    """

    def __init__(self, manager_url: str, token: str | None, rabbitmq_api: str | None, consumers: int,
                 log_dir: Path, service: SessionService | None = None) -> None:
        import asyncio
        import threading

        self._asyncio = asyncio
        self.log_dir = log_dir
        self._args = (manager_url, token, rabbitmq_api, consumers)
        self._service = service
        self._loop = asyncio.new_event_loop()
        self._stop: Any = None
        self._thread = threading.Thread(target=self._run, name="labswarm-health", daemon=True)
        self._plotting: threading.Thread | None = None

    def _run(self) -> None:
        from labswarm.health.monitors import ManagerMonitor, RabbitMQMonitor
        from labswarm.run.direct import ServiceMonitor

        manager_url, token, rabbitmq_api, consumers = self._args
        asyncio = self._asyncio
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            manager = ManagerMonitor(manager_url, token) if self._service is None else ServiceMonitor(self._service)
            loop = figure_loop(self.prepare_figure, manager,
                               RabbitMQMonitor(rabbitmq_api) if rabbitmq_api else None,
                               consumers=consumers, log_dir=self.log_dir)
            try:
                await loop.run(self._stop)
            finally:
                await loop.manager.aclose()
                if loop.rabbitmq is not None:
                    await loop.rabbitmq.aclose()

        self._loop.run_until_complete(main())
        self._loop.close()

    def start(self) -> HealthThread:
        self._thread.start()
        return self

    def prepare_figure(self) -> None:
        """Import what the figure is drawn with, in a thread, once (later calls do nothing). The figure is drawn
        once the session ends, on the run's critical path: matplotlib's import there took 3-4 s of wall time on a
        loaded 2-core machine (0.35-0.45 s of CPU), so the run imports it while the session runs; but not at the
        session's start, where that CPU (and this process's GIL) delayed the manager's serving of the session and
        the workers' start (issue 27: the first task of a short run): the loop calls this when it first logs a
        decision (:func:`figure_loop`; from its second tick with outcomes, so not at the start), the one case where a
        figure is drawn (was: when a progress poll before the final one saw outcomes, which a short or cached
        session skips, leaving the import to the end)."""
        import threading

        if self._plotting is None:
            self._plotting = threading.Thread(target=_import_plotting, name="labswarm-plot-import", daemon=True)
            self._plotting.start()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def figure_loop(on_log: Callable[[], None], *args: Any, **kwargs: Any) -> HealthLoop:
    """A :class:`~labswarm.health.loop.HealthLoop` (``args``, ``kwargs`` its own) that calls ``on_log`` after each
    decision it writes to its log (``log_dir`` set): the health figure's data exists from then on."""
    from labswarm.health.loop import HealthLoop

    class _FigureLoop(HealthLoop):
        def _record(self, *record: Any) -> None:
            super()._record(*record)
            if self.log_dir is not None:
                on_log()

    return _FigureLoop(*args, **kwargs)


def _import_plotting() -> None:
    """Import what :func:`health_figure` draws with (matplotlib with its Agg backend); errors are left to it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # the import is the point: its modules cached for the figure
    except Exception:  # a broken matplotlib is reported by health_figure, at its time
        return


def health_figure(log_dir: Path, session_id: str) -> Path | None:
    """The session's health figure, when the controller logged decisions (a run all cached logs none)."""
    from labswarm.errors import LabswarmError
    from labswarm.health.plot import plot_session

    log = log_dir / f"health-{session_id}.jsonl"
    if not log.is_file():
        return None
    try:
        return plot_session(log, log.with_suffix(".png"), title=f"session {session_id}")
    except LabswarmError:
        return None
