"""A session's history (issue 27, item 5): kept in the manager's database, bounded, served.

- over a real manager (uvicorn in a thread, the embedded broker) a session runs to its end while the test reports
  outcomes as a worker does: ``GET /sessions/{id}/series`` spans the session from its start (every counter 0) to its
  end (its final counts), with measured rates, and the event stream starts with the same history;
- the bound: the manager's recorder over a real database (SQLite and PostgreSQL) keeps a long session (its clock
  driven by the test, ten minutes of readings) under ``max_points`` at every reading, evenly spaced over the whole
  session, across a manager restart, with rates that still integrate to the counts once downsampled.
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from helpers import experiment_dict, write_dataset

from labswarm.client import parse_sse
from labswarm.db import make_engine, make_sessionmaker
from labswarm.sessions import history, ledger, queries
from labswarm.sessions.models import ExperimentRow, SeriesPointRow, SessionRow
from labswarm.settings import Settings

#: Unix time of the simulated session's start.
T0 = 1_800_000_000.0


def test_step_and_thinning_rules() -> None:
    assert history.step_for(0) == history.step_for(1000) == 1.0
    assert history.step_for(1001) == 2.0 and history.step_for(2000) == 2.0 and history.step_for(2001) == 4.0
    assert history.step_for(86_400) == 128.0  # a day: 675 points
    times = [float(t) for t in range(101)]
    kept = history.thin(times, 10.0)
    assert [times[i] for i in kept] == [float(t) for t in range(0, 101, 10)]
    assert history.thin([0.0, 0.5, 0.7], 10.0) == [0, 2]  # the first and the last always
    assert history.thin([], 1.0) == [] and history.thin([3.0], 1.0) == [0]


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.1)


def test_a_finished_sessions_history_is_served_whole(tmp_path: Path) -> None:
    from labswarm.manager.api import create_app
    from labswarm.manager.server import EmbeddedServer

    app = create_app(Settings(home=tmp_path / "home", data_roots=[str(tmp_path)]))
    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/sessions/nope00000000/series").status_code == 404
            data = write_dataset(tmp_path / "data", n_per_label=5)  # 10 clips x 2 transformations
            assert http.post("/experiments", json=experiment_dict(data, tmp_path / "store", name="hist")).is_success
            sid = http.post("/experiments/hist/sessions", json={"rate": 4}).json()["id"]
            live = http.get(f"/sessions/{sid}/series").json()
            assert live["end"] is None and live["points"][0]["published"] == 0

            def report() -> bool:  # a worker's outcomes for what is published, a few at a time
                with app.state.sessions.db() as db:
                    published = [sample for sample, _ in ledger.pending(db, sid)][:3]
                outcomes = [{"sample_id": s, "status": "computed", "seconds": 0.01} for s in published]
                assert http.post(f"/sessions/{sid}/outcomes", json={"outcomes": outcomes}).is_success
                return http.get(f"/sessions/{sid}").json()["status"] == "completed"

            _wait(lambda: report() or time.sleep(0.5), 120, "the session completed")
            end = http.get(f"/sessions/{sid}").json()
            _wait(lambda: http.get(f"/sessions/{sid}/series").json()["points"][-1]["finished"] == 20, 30,
                  "the history's last point")
            body = http.get(f"/sessions/{sid}/series").json()
            with http.stream("GET", f"/sessions/{sid}/events") as response:
                first = next(iter(parse_sse(response.iter_lines())))
    finally:
        server.stop()
    points = body["points"]
    start = datetime.fromisoformat(end["started_at"]).replace(tzinfo=UTC).timestamp()
    finish = datetime.fromisoformat(end["finished_at"]).replace(tzinfo=UTC).timestamp()
    assert (body["session"], body["status"], body["max_points"]) == (sid, "completed", history.MAX_POINTS)
    assert body["start"] == pytest.approx(start) and body["end"] == pytest.approx(finish)
    assert len(points) >= 5, points  # one a second over a session of several seconds
    assert points[0] == {"time": pytest.approx(start), "depth": 0, "published": 0, "finished": 0,
                         "publish_rate": None, "consume_rate": None, "asked_rate": 4.0}
    assert points[-1]["time"] == pytest.approx(finish) and points[-1]["published"] == 20
    assert points[-1]["depth"] == 0 and points[-1]["asked_rate"] == 0.0  # ended: nothing asked any more
    times = [p["time"] for p in points]
    assert times == sorted(times) and times[-1] - times[0] == pytest.approx(finish - start)
    assert max(p["publish_rate"] or 0 for p in points) > 0 and max(p["consume_rate"] or 0 for p in points) > 0
    assert max(p["depth"] for p in points) > 0
    # the stream's first event is the same history
    assert (first["id"], first["event"]) == (1, "series") and first["data"] == body


def _session(db, now: float) -> None:
    db.add(ExperimentRow(name="long", config={}, fingerprint="f"))
    db.add(SessionRow(id="long00000000", experiment="long", status="running", rate=3.0, total=10**7,
                      fingerprint="f", started_at=datetime.fromtimestamp(now, UTC).replace(tzinfo=None)))
    db.commit()


def test_a_long_sessions_history_stays_bounded_and_even(tmp_path: Path, database_url: str) -> None:
    engine = make_engine(database_url)
    db = make_sessionmaker(engine)
    clock = [0.0]  # readings at T0 + 0.5, T0 + 1.5, ...: one a second

    def now() -> float:
        return T0 + 0.5 + clock[0]

    with db() as s:
        _session(s, T0)
    max_points, seconds = 40, 600
    recorder = history.HistoryRecorder(db, queries.progress, max_points=max_points, clock=now)
    finished = 0
    for second in range(seconds):
        if second == seconds // 2:  # a manager restart: a new recorder continues the stored history
            recorder = history.HistoryRecorder(db, queries.progress, max_points=max_points, clock=now)
        clock[0] = second
        finished += 4 * (second % 2)  # 0, 4, 0, 4: 2/s on average, uneven second to second
        with db() as s:
            row = s.get(SessionRow, "long00000000")
            row.published, row.done, row.pending = 3 * second, finished, 3 * second - finished
            if second == seconds - 1:
                row.status = "completed"
                row.finished_at = datetime.fromtimestamp(now(), UTC).replace(tzinfo=None)
            s.commit()
        recorder.tick()
        with db() as s:
            assert len(history.read(s, "long00000000")) <= max_points, second
    with db() as s:
        points = history.read(s, "long00000000")
        assert s.query(SeriesPointRow).count() == len(points)
    engine.dispose()
    times = [p["time"] for p in points]
    step = history.step_for(times[-1] - T0, max_points=max_points)
    assert step == 32.0  # 600 s at 20 points: 1 s doubled five times
    assert times[0] == T0 and points[0]["finished"] == 0  # one origin, across the restart too
    assert times[-1] == T0 + 0.5 + seconds - 1 and points[-1]["finished"] == finished
    assert max_points // 2 - 4 <= len(points) <= max_points // 2 + 2, str([t - T0 for t in times])
    gaps = [b - a for a, b in itertools.pairwise(times[1:-1])]
    # even over the whole session: one to two steps apart (thinned from points at most a step apart)
    assert all(0.99 * step <= gap < 2 * step for gap in gaps), str([t - T0 for t in times])
    # rates over the gaps (> 5 s): their integral is the counts, the 0/4 alternation averaged to 2/s
    for a, b in itertools.pairwise(points[:-1]):
        assert b["consume_rate"] * (b["time"] - a["time"]) == pytest.approx(b["finished"] - a["finished"])
        assert b["publish_rate"] == pytest.approx(3.0, rel=0.2) and b["consume_rate"] == pytest.approx(2.0, rel=0.2)
