"""The manager's request body limit (labswarm.auth.limits) over real HTTP: a uvicorn server in a thread, raw
sockets for bodies whose size a client would not declare honestly."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from helpers import experiment_dict

from labswarm.auth.limits import MAX_BODY_BYTES, BodyLimit
from labswarm.client import ManagerClient
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.queue.reporter import MAX_PER_REQUEST, Reporter
from labswarm.settings import Settings

TOKEN = "body-limit-token"
LIMIT = 4096


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    app = create_app(Settings(home=tmp_path / "home", api_token=TOKEN, max_body_bytes=LIMIT))
    server = EmbeddedServer(app).start()
    yield server
    server.stop()


@pytest.fixture
def http(server: EmbeddedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def _experiment(tmp_path: Path, padding: int) -> dict:
    """An experiment whose JSON is about ``padding`` bytes larger than a minimal one (an unknown key: a 422 when
    the body is read at all)."""
    return experiment_dict(tmp_path / "data", tmp_path / "store", name="limited") | {"_pad": "x" * padding}


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    reason = response.json()["detail"]
    assert "request body too large" in reason and str(LIMIT) in reason and "max_body_bytes" in reason, reason


def test_a_declared_body_over_the_limit_is_413_and_one_under_it_is_read(http: httpx.Client, tmp_path: Path) -> None:
    _refused(http.post("/experiments", json=_experiment(tmp_path, 2 * LIMIT)))
    under = http.post("/experiments", json=_experiment(tmp_path, 0))
    assert under.status_code == 422 and "_pad" in under.text, under.text  # read and validated (unknown key)


def test_a_streamed_body_is_counted_not_trusted(http: httpx.Client, tmp_path: Path) -> None:
    """No Content-Length (chunked transfer): the chunks are counted and the request refused past the limit."""
    body = json.dumps(_experiment(tmp_path, 4 * LIMIT)).encode()
    chunks = (body[i:i + 1000] for i in range(0, len(body), 1000))
    _refused(http.post("/experiments", content=chunks, headers={"Content-Type": "application/json"}))
    small = json.dumps(_experiment(tmp_path, 0)).encode()
    response = http.post("/experiments", content=iter([small[:100], small[100:]]),
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and "_pad" in response.text, response.text


def test_the_limit_comes_before_authentication(server: EmbeddedServer, tmp_path: Path) -> None:
    """A large body from anyone is refused without reading it; the token check does not need it."""
    with httpx.Client(base_url=server.url, timeout=10.0) as anonymous:
        _refused(anonymous.post("/experiments", json=_experiment(tmp_path, 2 * LIMIT)))
        assert anonymous.post("/experiments", json=_experiment(tmp_path, 0)).status_code == 401


def test_the_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_body_bytes == 1024 * 1024
    monkeypatch.setenv("LABSWARM_MAX_BODY_BYTES", "2097152")
    assert Settings().max_body_bytes == 2 * 1024 * 1024


def test_a_worker_backlog_is_reported_in_requests_under_the_default_limit() -> None:
    """A worker's reporter sends a backlog of outcomes (the manager was away) in requests of at most
    MAX_PER_REQUEST outcomes, each under the default 1 MiB limit: none is refused, none is lost."""
    received: list[int] = []
    app = FastAPI()
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.post("/sessions/{session_id}/outcomes")
    async def outcomes(session_id: str, request: Request) -> dict:
        received.append(len((await request.json())["outcomes"]))
        return {"applied": received[-1]}

    server = EmbeddedServer(app).start()
    try:
        with ManagerClient(server.url) as client:
            reporter = Reporter(client, interval=3600.0)
            reporter.stop()  # the flush below sends the backlog, not the thread (close() would wait 5 s at most)
            reason = "AudioError: " + "r" * 400  # a long failure reason: ~0.5 kB per outcome
            n = 5 * MAX_PER_REQUEST + 7
            # the backlog queued at once
            reporter.add_many("s1", [{"sample_id": f"clips/clip_{i:06d}.wav#3", "status": "failed",
                                      "reason": reason, "seconds": 0.5} for i in range(n)])
            assert len(json.dumps({"outcomes": [{"reason": reason}] * n})) > MAX_BODY_BYTES  # one request: 413
            assert reporter.flush()
            reporter.close()
    finally:
        server.stop()
    assert received == [MAX_PER_REQUEST] * 5 + [7]


def test_a_body_sent_to_a_streamed_answer_is_refused_or_dropped_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    """A GET whose route streams (the event streams) and reads no body, sent a chunked body over the limit: the
    stream's disconnect listener receives it. The client gets the 413 (nothing sent yet) or the whole stream
    (the rest of the body dropped), never a cut stream; the server logs no error (was: the 413 raised in the
    listener's task, 'Caught handled exception, but response already started', the stream cut)."""
    import asyncio

    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.add_middleware(BodyLimit, max_bytes=LIMIT)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def lines() -> object:
            for i in range(3):
                await asyncio.sleep(0.05)
                yield f"line {i}\n"
        return StreamingResponse(lines(), media_type="text/plain")

    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10.0) as client:
            for _ in range(5):  # either side of the race between the listener and the stream's first send
                response = client.request("GET", "/stream", content=(b"x" * 1000 for _ in range(20)))
                if response.status_code == 413:
                    _refused(response)
                else:
                    assert response.status_code == 200 and response.text == "line 0\nline 1\nline 2\n"
                assert client.get("/stream").text == "line 0\nline 1\nline 2\n"  # no body: streamed as ever
    finally:
        server.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
