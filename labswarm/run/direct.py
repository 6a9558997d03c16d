"""``labswarm run``'s own loops reading its embedded manager's sessions in-process, not over HTTP (issue 27).

A run that starts its manager in this process polled it over HTTP from the same process: the progress wait
(``GET /sessions/{id}`` every 0.5 s) and the health loop (``GET /sessions`` and ``PUT /sessions/{id}/rate`` about
once a second each): 4 of the ~8 requests a second the manager served during a steady 270-sample run, at 2.5-2.9 ms
of the manager's CPU each on a loaded 2-core machine (1-1.5 ms quiet; bench/steady_cpu.py, docs/benchmarks/steady.md)
plus the client's own, on the cores that compute the samples. Here they call the manager's
:class:`~labswarm.sessions.service.SessionService` directly: the same methods its routes call, with the answers
put through FastAPI's own :func:`~fastapi.encoders.jsonable_encoder` (what the route's JSON response holds: times as
ISO strings), so the loops see what they saw over HTTP. The service is already called from the server's request
threads at once; these calls are two more threads of the same kind.

The workers' outcome reports, the dashboard and any other client still go over HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi.encoders import jsonable_encoder

from labswarm.errors import ManagerError
from labswarm.health.monitors import MAX_ACTIVE, ManagerMonitor
from labswarm.sessions.service import SessionService
from labswarm.sessions.states import ACTIVE

T = TypeVar("T")


def _called(what: str, call: Callable[[], T]) -> T:
    """``call()``, its errors (no such session, one that has ended, a database error) raised as
    :class:`~labswarm.errors.ManagerError` naming ``what``, as the HTTP client raises them."""
    try:
        return call()
    except Exception as exc:
        raise ManagerError(f"in-process manager: {what}: {type(exc).__name__}: {exc}") from exc


class ServiceProgress:
    """A session's progress from the run's own manager, as :meth:`labswarm.client.ManagerClient.session` gives it
    (``GET /sessions/{id}``'s JSON), without the request.

    Args:
        service: the embedded manager's sessions (``app.state.sessions``).
    """

    def __init__(self, service: SessionService) -> None:
        self.service = service

    def session(self, session_id: str) -> dict[str, Any]:
        """A session's progress (the keys of ``GET /sessions/{id}``; times as ISO 8601 strings).

        Raises:
            ManagerError: no such session, or the database failed.
        """
        progress = _called(f"session {session_id}", lambda: self.service.progress(session_id))
        return dict(jsonable_encoder(progress))


class ServiceMonitor(ManagerMonitor):
    """The health loop's :class:`~labswarm.health.monitors.ManagerMonitor` reading the run's own manager in-process:
    the active sessions' progress and their rates set through the service, not its routes. The users' weights are
    not read (``labswarm run``'s loop does not ask them: one user, its own sessions).

    Args:
        service: the embedded manager's sessions (``app.state.sessions``).
    """

    def __init__(self, service: SessionService) -> None:  # no HTTP client: nothing of ManagerMonitor's is used
        self.url = "in-process"
        self.service = service

    async def sessions(self) -> list[dict[str, Any]]:
        """Progress of the active sessions, running or paused (at most :data:`MAX_ACTIVE`), newest first: the
        JSON of ``GET /sessions?status=running&status=paused`` for an admin.

        Raises:
            ManagerError: the database failed.
        """
        def read() -> list[dict[str, Any]]:
            return [self.service.progress_of(row) for row in self.service.sessions(sorted(ACTIVE), MAX_ACTIVE)]

        return list(jsonable_encoder(_called("the active sessions", read)))

    async def user_weights(self) -> tuple[dict[str, float], float] | None:
        """``None``: the weights are not told this way (the loop keeps its own)."""
        return None

    async def set_rate(self, session_id: str, rate: float) -> None:
        """The session's publish rate (tasks/s), as ``PUT /sessions/{id}/rate`` sets it.

        Raises:
            ManagerError: ``rate`` is not > 0, no such session, or it has ended.
        """
        _called(f"session {session_id}'s rate", lambda: self.service.set_rate(session_id, rate))

    async def aclose(self) -> None:
        """Nothing to close."""
