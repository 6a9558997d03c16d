"""``GET /sessions/{id}/events`` over real HTTP: a real manager (uvicorn in a thread) and a session publishing on
the embedded broker; the test reports outcomes as a worker does, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
from helpers import experiment_dict, write_dataset

from labswarm.client import parse_sse
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.sessions import ledger
from labswarm.settings import Settings


def events(http: httpx.Client, path: str, count: int, headers: dict | None = None) -> Iterator[dict]:
    """The first ``count`` events of the stream at ``path`` (``{id, event, data}``), or all if it ends before."""
    with http.stream("GET", path, headers=headers or {}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in parse_sse(response.iter_lines()):
            yield event
            count -= 1
            if count == 0:
                return


def test_the_stream_numbers_snapshots_measures_rates_and_ends_with_the_session(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path / "home", data_roots=[str(tmp_path)]))
    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/sessions/nope/events").status_code == 404
            data = write_dataset(tmp_path / "data", n_per_label=5)  # 10 clips x 2 transformations
            assert http.post("/experiments", json=experiment_dict(data, tmp_path / "store", name="stream")).is_success
            sid = http.post("/experiments/stream/sessions", json={"rate": 50}).json()["id"]
            seen = list(events(http, f"/sessions/{sid}/events?interval=0.2", 4))
            assert [e["id"] for e in seen] == [1, 2, 3, 4]  # first the session's history, then snapshots
            assert [e["event"] for e in seen] == ["series", "progress", "progress", "progress"]
            assert seen[0]["data"]["session"] == sid and seen[0]["data"]["points"][0]["published"] == 0
            seen = seen[1:]
            first = seen[0]["data"]
            assert first["publish_rate"] is None and first["consume_rate"] is None  # one snapshot: no slope yet
            assert first["id"] == sid and first["total"] == 20 and first["depth"] == first["pending"]
            assert seen[2]["data"]["time"] > seen[0]["data"]["time"]
            assert seen[2]["data"]["publish_rate"] is not None

            # a worker's outcomes of what is published, over HTTP, until the session completes: the stream measures
            # the consume rate, its numbering goes on after the client's last id, and it ends with the session
            def report() -> None:
                with app.state.sessions.db() as db:
                    published = [sample for sample, _ in ledger.pending(db, sid)]
                outcomes = [{"sample_id": s, "status": "computed", "seconds": 0.01} for s in published]
                assert http.post(f"/sessions/{sid}/outcomes", json={"outcomes": outcomes}).is_success

            seen = []
            for event in events(http, f"/sessions/{sid}/events?interval=0.2", 1000, {"Last-Event-ID": "41"}):
                seen.append(event)
                if event["event"] == "progress" and event["data"]["pending"]:
                    report()
            assert [e["id"] for e in seen] == list(range(42, 42 + len(seen)))
            assert [e["event"] for e in seen[-2:]] == ["progress", "end"]  # and the stream closed
            last = seen[-2]["data"]
            assert last["status"] == "completed" and last["done"] == 20 and last["depth"] == 0
            assert max(e["data"].get("consume_rate") or 0 for e in seen) > 0
            assert seen[-1]["data"] == {"status": "completed"}
            # an ended session: its history, one snapshot dated at its end (not now), the end
            ended = list(events(http, f"/sessions/{sid}/events", 10))
            assert [e["event"] for e in ended] == ["series", "progress", "end"]
            assert ended[1]["data"]["time"] == ended[0]["data"]["end"]
            ended = list(events(http, f"/sessions/{sid}/events", 10, {"Last-Event-ID": ""}))  # empty: no header
            assert [e["event"] for e in ended] == ["series", "progress", "end"]
            # a browser's EventSource reconnects after the end with the last id: 204 is what stops it
            again = http.get(f"/sessions/{sid}/events", headers={"Last-Event-ID": str(seen[-1]["id"])})
            assert again.status_code == 204 and again.content == b""
            for bad in ("x1", "-1", "1.5", "\u0663".encode(), str(2**63)):  # not an event number: 400, not a replay
                answer = http.get(f"/sessions/{sid}/events", headers={"Last-Event-ID": bad})
                assert answer.status_code == 400 and "Last-Event-ID" in answer.json()["detail"], (bad, answer.text)
    finally:
        server.stop()
