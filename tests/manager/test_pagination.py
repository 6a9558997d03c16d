"""Listing sessions at scale over real HTTP (issue 10, item 3): ``GET /sessions`` pages (limit, offset, status
filter, a bounded default page), the ``failures`` page bound, and the pollers of every second (the health
loop's monitor, ``/metrics``) that see only the active sessions among many ended ones, at a cost that does not
grow with the sessions ever run. Sessions are written straight into the manager's SQLite database after it
started (no publisher runs for them: progress is read from their rows)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event

from labswarm.health.monitors import ManagerMonitor
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.sessions import ledger
from labswarm.sessions.metrics import RECENT
from labswarm.sessions.models import ExperimentRow, SessionRow
from labswarm.sessions.service import MAX_FAILURES_PAGE, MAX_SESSIONS_PAGE, SESSIONS_PAGE, SessionService
from labswarm.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[httpx.Client, SessionService]]:
    app = create_app(Settings(home=tmp_path / "home"))
    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30.0) as http:
            yield http, app.state.sessions
    finally:
        server.stop()


def add_sessions(service: SessionService, statuses: list[str], start: int = 0) -> list[str]:
    """Session rows of experiment ``e`` with ``statuses``, created one second apart from ``T0 + start`` s;
    returns their ids, oldest first."""
    ids = [f"s{start + k:05d}" for k in range(len(statuses))]
    with service.db() as db:
        if db.get(ExperimentRow, "e") is None:
            db.add(ExperimentRow(name="e", config={}, fingerprint="f"))
            db.flush()
        for k, (sid, status) in enumerate(zip(ids, statuses, strict=True)):
            db.add(SessionRow(id=sid, experiment="e", status=status, rate=1.0, fingerprint="f", total=10,
                              created_at=T0 + timedelta(seconds=start + k)))
        db.commit()
    return ids


def listed(http: httpx.Client, **params) -> list[str]:
    response = http.get("/sessions", params=params)
    response.raise_for_status()
    return [s["id"] for s in response.json()]


def test_pages_by_limit_offset_and_status(manager) -> None:
    http, service = manager
    ended = add_sessions(service, ["completed", "cancelled", "failed"] * 20)  # 60
    active = add_sessions(service, ["paused"], start=100)  # one active (the index allows one per experiment)
    newest_first = [*active, *reversed(ended)]
    assert len(listed(http)) == SESSIONS_PAGE  # the default page is bounded
    pages = [listed(http, limit=7, offset=o) for o in range(0, 70, 7)]
    assert [sid for page in pages for sid in page] == newest_first  # every session once, newest first
    assert listed(http, status="paused") == active
    assert listed(http, status=["completed", "failed"], limit=100) == [
        s for s in reversed(ended) if int(s[1:]) % 3 in (0, 2)]
    for bad in ({"limit": 0}, {"limit": MAX_SESSIONS_PAGE + 1}, {"offset": -1}, {"status": "finished"}):
        response = http.get("/sessions", params=bad)
        assert response.status_code == 422, bad
        assert next(iter(bad)) in response.text  # the error names the field


def test_failures_page_is_bounded(manager) -> None:
    http, service = manager
    (sid,) = add_sessions(service, ["completed"])
    with service.db() as db:
        ledger.add_samples(db, sid, [(f"x{i}", "published", None) for i in range(5)])
        ledger.set_status(db, sid, [f"x{i}" for i in range(5)], "failed", "AudioError")
        db.commit()
    page = http.get(f"/sessions/{sid}/failures", params={"limit": 2, "offset": 1}).json()
    assert [f["sample_id"] for f in page] == ["x1", "x2"] and page[0]["reason"] == "AudioError"
    assert http.get(f"/sessions/{sid}/failures", params={"limit": MAX_FAILURES_PAGE + 1}).status_code == 422
    assert http.get(f"/sessions/{sid}").json()["failed"] == 5


def statements(service: SessionService, call) -> int:
    """SQL statements the manager runs while ``call()`` runs."""
    seen: list[str] = []
    listener = lambda *args: seen.append(args[2])  # noqa: E731
    event.listen(service.engine, "before_cursor_execute", listener)
    try:
        call()
    finally:
        event.remove(service.engine, "before_cursor_execute", listener)
    return len(seen)


def test_monitor_and_metrics_see_only_active_sessions_at_a_cost_that_does_not_grow(manager) -> None:
    http, service = manager
    add_sessions(service, ["completed"] * 30)
    running = add_sessions(service, ["running"], start=1_000)

    def poll() -> tuple[list[str], str]:
        seen = asyncio.run(monitor_sessions(str(http.base_url)))
        metrics = http.get("/metrics")
        metrics.raise_for_status()
        return seen, metrics.text

    seen, text = poll()  # also the first read of the running session: its counters recounted once
    assert seen == running
    assert text.count('labswarm_session_active{') == 1 + RECENT  # the active one and the 10 latest ended
    before = statements(service, poll)
    add_sessions(service, ["completed", "failed", "cancelled"] * 100, start=2_000)  # 300 more ended sessions
    poll()  # the newest ended ones are read once (recent in /metrics)
    after = statements(service, poll)
    assert after == before, (before, after)
    assert poll()[0] == running


async def monitor_sessions(url: str) -> list[str]:
    """The ids of the sessions the health loop's monitor reads from the manager at ``url``."""
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        return [s["id"] for s in await ManagerMonitor(url, client=client).sessions()]
