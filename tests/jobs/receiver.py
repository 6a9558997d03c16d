"""A real HTTP endpoint that takes a learner's reports the way the manager does (events stored once per learner
by their number, metrics once per job by their key), for the learner's tests without a manager."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Stores reports; ``halt`` makes every answer ask the learner to halt.

    Attributes:
        url: the base URL to give learners.
        events: ``(attempt, rank, event)`` in arrival order, each learner's events once.
        progress: the last progress of each ``(attempt, rank)``.
        requests: the number of reports received.
        max_body: the largest request body taken, in bytes.
        max_body_bytes: a body over it is refused with 413 as the manager's limit does (``None``: no limit).
    """

    def __init__(self, max_body_bytes: int | None = None) -> None:
        self.max_body = 0
        self.max_body_bytes = max_body_bytes
        self.events: list[tuple[int, int, dict[str, Any]]] = []
        self.progress: dict[tuple[int, int], dict[str, Any]] = {}
        self.requests = 0
        self.halt = False
        self._last: dict[tuple[int, int], int] = {}
        self._keys: set[str] = set()
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")  # v1 jobs <id> attempts <n> reports
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.max_body_bytes is not None and len(raw) > receiver.max_body_bytes:
                    status, answer = 413, {"detail": "request body too large"}
                else:
                    receiver.max_body = max(receiver.max_body, len(raw))
                    status, answer = 200, receiver._take(int(parts[4]), json.loads(raw))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, attempt: int, body: dict[str, Any]) -> dict[str, Any]:
        who = (attempt, body["rank"])
        with self._changed:
            self.requests += 1
            last = self._last.get(who, -1)
            for event in body["events"]:
                if event["n"] <= last:
                    continue
                last = event["n"]
                if event["key"] is not None:
                    if event["key"] in self._keys:
                        continue
                    self._keys.add(event["key"])
                self.events.append((attempt, body["rank"], event))
            self._last[who] = last
            self.progress[who] = body["progress"]
            self._changed.notify_all()
            return {"received": last, "halt": self.halt}

    def wait_for(self, condition: Callable[[], Any], timeout: float = 120.0) -> Any:
        """Wait until ``condition()`` (called under the lock) is truthy; returns its value.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (value := condition()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"condition not met within {timeout} s")
                self._changed.wait(left)
            return value

    def kinds(self, kind: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """The payloads of the events of one kind (of one attempt)."""
        return [e["payload"] for a, _r, e in self.events if e["kind"] == kind and attempt in (None, a)]

    def lines(self, attempt: int | None = None) -> list[str]:
        """The log lines received."""
        return [p["line"] for p in self.kinds("log", attempt)]


@contextmanager
def receiver(max_body_bytes: int | None = None) -> Iterator[Receiver]:
    """A running :class:`Receiver`, shut down afterwards."""
    r = Receiver(max_body_bytes)
    r._thread.start()
    try:
        yield r
    finally:
        r._server.shutdown()
        r._server.server_close()
