"""The workers' outcome reporter (labswarm.queue.reporter) against a real HTTP server: a message's outcomes leave
in one request as soon as they are queued, later ones wait for the interval and go together, a failed request is
tried again, and nothing is sent twice. The interval is made long (60 s) where a test checks what has not been
sent yet, so that no load can make the check pass or fail by timing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import wait_until

from labswarm.client import ManagerClient
from labswarm.queue.reporter import Reporter


class Manager:
    """A stand-in for the manager's outcomes route over real HTTP: records each request's session and outcomes;
    answers 503 to the first ``failures`` requests, then 200 with a body that is not JSON (a proxy's page) to the
    next ``garbled`` ones (recording nothing of them)."""

    def __init__(self, failures: int = 0, garbled: int = 0) -> None:
        self.requests: list[tuple[str, list[str]]] = []
        self.failures = failures
        self.garbled = garbled
        manager = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if manager.failures > 0:
                    manager.failures -= 1
                    self._answer(503, {"detail": "busy"})
                    return
                if manager.garbled > 0:
                    manager.garbled -= 1
                    page = b"<html>proxy says hello</html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                session = self.path.split("/")[2]
                manager.requests.append((session, [o["sample_id"] for o in body["outcomes"]]))
                self._answer(200, {"recorded": len(body["outcomes"])})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def manager() -> Iterator[Manager]:
    server = Manager()
    yield server
    server.close()


def outcome(sample_id: str) -> dict:
    return {"sample_id": sample_id, "status": "computed", "reason": None, "seconds": 0.05, "finished_at": 0.0}


def test_a_message_leaves_at_once_later_ones_together_after_the_interval(manager: Manager) -> None:
    reporter = Reporter(ManagerClient(manager.url), interval=60.0)
    try:
        reporter.add_many("s1", [outcome("a#0"), outcome("a#1"), outcome("a#2")])
        # sent at once (a clock-driven reporter would hold it for the interval, 60 s), in one request
        wait_until(lambda: manager.requests, "the first message's outcomes sent", timeout=30)
        assert manager.requests == [("s1", ["a#0", "a#1", "a#2"])]
        reporter.add("s1", outcome("b#0"))
        reporter.add_many("s1", [outcome("b#1")])
        reporter.add_many("s2", [])  # nothing to send: no request
        assert manager.requests == [("s1", ["a#0", "a#1", "a#2"])]  # within the interval: held
    finally:
        reporter.close()  # sends what is held
        reporter.client.close()
    assert manager.requests == [("s1", ["a#0", "a#1", "a#2"]), ("s1", ["b#0", "b#1"])]


def test_a_failed_request_is_sent_again_once() -> None:
    manager = Manager(failures=2)
    reporter = Reporter(ManagerClient(manager.url), interval=0.05)
    try:
        reporter.add_many("s1", [outcome("a#0"), outcome("a#1")])
        wait_until(lambda: manager.requests, "the outcomes sent after two 503s", timeout=30)
        reporter.add("s1", outcome("b#0"))
        wait_until(lambda: len(manager.requests) == 2, "the next outcome sent", timeout=30)
    finally:
        reporter.close()
        reporter.client.close()
        manager.close()
    assert manager.requests == [("s1", ["a#0", "a#1"]), ("s1", ["b#0"])]  # in order, each once


def test_an_answer_that_is_not_json_or_a_closed_client_does_not_kill_the_thread(
        caplog: pytest.LogCaptureFixture) -> None:
    """A 200 whose body is not JSON (a decode error, not a ManagerError): the outcomes are kept and sent again an
    interval later, and the thread goes on sending the next ones (was: the thread died, the batch was lost and every
    later outcome stayed queued until the process ended). A flush on a closed client keeps them too."""
    manager = Manager(garbled=1)
    reporter = Reporter(ManagerClient(manager.url), interval=0.05)
    try:
        reporter.add_many("s1", [outcome("a#0"), outcome("a#1")])
        wait_until(lambda: manager.requests, "the outcomes sent again after a garbled answer", timeout=30)
        reporter.add("s1", outcome("b#0"))
        wait_until(lambda: len(manager.requests) == 2, "the next outcome sent by the same thread", timeout=30)
        assert reporter._thread.is_alive()
        assert any("cannot report 2 outcomes of session s1" in r.getMessage() and r.exc_info
                   for r in caplog.records), caplog.text
        reporter.stop()
        reporter.client.close()
        reporter.add("s1", outcome("c#0"))
        assert not reporter.flush()  # RuntimeError of the closed client: kept, not raised
        assert [o["sample_id"] for o in reporter._pending["s1"]] == ["c#0"]
    finally:
        reporter.close()
        reporter.client.close()
        manager.close()
    assert manager.requests == [("s1", ["a#0", "a#1"]), ("s1", ["b#0"])]


def test_a_round_that_sends_nothing_does_not_hold_the_next_outcome(manager: Manager) -> None:
    """The wake left set by an outcome queued between a round's wake-up and its taking the queue (it went with that
    round): the next round finds nothing to send, and must not count as a request, else the next outcome would wait
    a whole interval (here an hour) instead of leaving at once."""
    reporter = Reporter(ManagerClient(manager.url), interval=3600.0)
    try:
        reporter._wake.set()  # that left-over wake, with nothing queued
        wait_until(lambda: not reporter._wake.is_set(), "the empty round", timeout=30, interval=0.01)
        reporter.add("s1", outcome("a#0"))
        wait_until(lambda: manager.requests, "the outcome sent at once", timeout=30)
        assert manager.requests == [("s1", ["a#0"])]
    finally:
        reporter.close()
        reporter.client.close()
