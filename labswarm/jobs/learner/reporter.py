"""What a learner tells the manager: log lines, metrics, phases and heartbeats, over HTTP, in batches.

The trainer knows nothing of HTTP: the learner's hooks hand records to a :class:`JobReporter`, whose daemon
thread posts them every ``interval`` seconds (0.2 s: a metric reaches the event stream well within 1 s) and at
least every ``heartbeat_s`` seconds (an empty report is the heartbeat the watchdog waits for)::

    POST {manager}/v1/jobs/{job_id}/attempts/{attempt}/reports
    {"rank": 0, "progress": {"epoch": 2, "step": 17, ...},
     "events": [{"n": 41, "kind": "log", "key": null, "payload": {"line": "..."}, "time": 1763887000.1}, ...]}
    → 200 {"received": 41, "halt": false}

Exactly once: events are numbered per learner (``n`` from 0); the manager stores those above the last ``n`` it
stored for this learner and answers that number, so a batch resent after a lost answer is stored once. A metric
carries a ``key`` (``epoch:3``) that the manager keeps once per job, so the epochs a restarted attempt reports
again are not stored twice. ``halt: true`` (a halt request), or HTTP 404 / 409 (the job is gone, or this attempt
is no longer the job's current one), set the learner's halt event: it checkpoints and exits.

Progress within an epoch (:meth:`JobReporter.progress`) travels in two ways: as the ``progress`` field of every
report (the manager keeps the last one per learner: ``GET /v1/jobs/{id}`` shows it), and, at most every
``progress_s`` seconds (1 s) and at each epoch's end, as a ``progress`` event on the job's stream, which
``labswarm jobs submit --follow`` draws as a bar per epoch. Only the newest progress event waits: one not yet
sent is replaced by the next, so an outage cannot pile them up.

Events wait in memory while the manager is unreachable (at most :data:`MAX_PENDING`; beyond, the oldest are
dropped and one log line says how many). Payloads are sent as strict JSON: a float that is not finite (a NaN
loss, a macro F1 with no class defined) is sent as ``null`` (:func:`labswarm.strictjson.finite`).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Any

import httpx

from labswarm.strictjson import finite

log = logging.getLogger(__name__)

#: Events kept while the manager is unreachable.
MAX_PENDING = 50_000
#: Events per request.
BATCH = 500
#: Bytes of events per request (their JSON): half the manager's default body limit (1 MiB,
#: :data:`labswarm.auth.limits.MAX_BODY_BYTES`), so a backlog of long log lines is never refused with 413.
BATCH_BYTES = 512 * 1024
#: The longest log line sent, in characters (the rest is cut, with a mark).
MAX_LINE = 8192


def _batch(pending: collections.deque[dict[str, Any]]) -> list[dict[str, Any]]:
    """The oldest events waiting, at most :data:`BATCH` of them and :data:`BATCH_BYTES` of JSON (at least one)."""
    batch: list[dict[str, Any]] = []
    size = 0
    for event in pending:
        size += len(json.dumps(event, default=str)) + 2
        if batch and (len(batch) >= BATCH or size > BATCH_BYTES):
            break
        batch.append(event)
    return batch


class JobReporter:
    """Batches a learner's events to the manager; a daemon thread sends them (see the module docstring).

    Args:
        url: the manager's base URL.
        job_id: the job.
        attempt: this learner's attempt number (from 1).
        rank: this learner's rank.
        token: the API token (``LABSWARM_API_TOKEN``), sent as ``Authorization: Bearer``.
        halt: set when the manager asks the learner to stop; default: a new event.
        interval: seconds between sends while events wait; default 0.2.
        heartbeat_s: the longest time between two requests, in seconds; default 1.0.
        progress_s: the shortest time between two ``progress`` events, in seconds; default 1.0.
        timeout: seconds per request.
        transport: an httpx transport (tests).
    """

    def __init__(self, url: str, *, job_id: str, attempt: int, rank: int = 0, token: str | None = None,
                 halt: threading.Event | None = None, interval: float = 0.2, heartbeat_s: float = 1.0,
                 progress_s: float = 1.0, timeout: float = 5.0, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)
        self._path = f"/v1/jobs/{job_id}/attempts/{attempt}/reports"
        self.rank = rank
        self.halt = halt if halt is not None else threading.Event()
        #: the job's latest live change of training, from the manager's last answer (labswarm.jobs.learner.live)
        self.change: dict[str, Any] | None = None
        self.interval = interval
        self.heartbeat_s = heartbeat_s
        self.progress_s = progress_s
        self.gone = False  #: the manager said the job or this attempt is gone (404 / 409)
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._progress: dict[str, Any] = {}
        self._progress_sent = float("-inf")  # monotonic time of the last progress event
        self._next = 0
        self._dropped = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="labswarm-job-reporter", daemon=True)

    # what the learner reports
    def log(self, line: str) -> None:
        """One line of the learner's output (without its newline)."""
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + f" [... {len(line) - MAX_LINE} characters cut]"
        self._add("log", {"line": line})

    def metric(self, record: dict[str, Any], key: str | None = None) -> None:
        """A metrics record (JSON-ready); ``key`` (``epoch:3``) makes the manager keep it once per job."""
        self._add("metric", record, key=key, wake=True)

    def event(self, kind: str, payload: dict[str, Any]) -> None:
        """Another event: ``phase`` (``{"phase": "training" | "storing", ...}``) or ``checkpoint`` (a pointer)."""
        self._add(kind, payload, wake=True)

    def progress(self, *, final: bool = False, **fields: Any) -> None:
        """Where training stands (``epoch``, ``step``, ``loss``...): sent with the next request (replacing the
        last one) and, when ``progress_s`` seconds have passed since the last one or with ``final`` (an epoch's
        end), as a ``progress`` event too (see the module docstring)."""
        fields = finite(fields)
        with self._lock:
            self._progress = fields
            now = time.monotonic()
            if not final and now - self._progress_sent < self.progress_s:
                return
            self._progress_sent = now
            if self._pending and self._pending[-1]["kind"] == "progress":
                self._pending.pop()  # not sent yet: the newer one replaces it (its number is simply skipped)
        self._add("progress", dict(fields), wake=final)

    def _add(self, kind: str, payload: dict[str, Any], *, key: str | None = None, wake: bool = False) -> None:
        with self._lock:
            self._pending.append({"n": self._next, "kind": kind, "key": key, "payload": finite(payload),
                                  "time": time.time()})
            self._next += 1
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self._dropped += 1
        if wake:
            self._wake.set()

    # sending
    def start(self) -> JobReporter:
        """Start the sending thread (returns ``self``)."""
        self._thread.start()
        return self

    def flush(self) -> bool:
        """Send what waits now, in batches; ``True`` when the manager has everything (or the job is gone)."""
        with self._send_lock:
            while True:
                with self._lock:
                    if self._dropped:
                        dropped, self._dropped = self._dropped, 0
                        self._pending.append({"n": self._next, "kind": "log", "key": None, "time": time.time(),
                                              "payload": {"line": f"[labswarm: {dropped} events dropped while the "
                                                                  "manager was unreachable]"}})
                        self._next += 1
                    batch = _batch(self._pending)
                    rest = len(self._pending) - len(batch)
                    body = {"rank": self.rank, "progress": self._progress, "events": batch}
                if not self._post(body):
                    return self.gone
                if not rest:
                    return True

    def _post(self, body: dict[str, Any]) -> bool:
        try:
            response = self._http.post(self._path, json=body)
        except httpx.HTTPError as exc:
            self._warn(f"cannot reach the manager: {exc}")
            return False
        if response.status_code in (404, 409, 410):
            if not self.gone:
                self._warn(f"the manager no longer runs this attempt (HTTP {response.status_code}: "
                           f"{response.text[:200]}): stopping")
            self.gone = True
            self.halt.set()
            with self._lock:
                self._pending.clear()
            return False
        if response.status_code >= 400:
            self._warn(f"the manager refused a report: HTTP {response.status_code}: {response.text[:200]}")
            return False
        answer = response.json()
        received = int(answer.get("received", -1))
        with self._lock:
            while self._pending and self._pending[0]["n"] <= received:
                self._pending.popleft()
        if answer.get("halt"):
            self.halt.set()
        if answer.get("change"):
            self.change = answer["change"]
        if self._failing:
            log.info("reporting to the manager again")
            self._failing = False
        return True

    def _warn(self, message: str) -> None:
        if not self._failing:  # once per outage: the warning itself becomes a log line to report
            log.warning("%s (the events wait and are sent again)", message)
            self._failing = True

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            with self._lock:
                waiting = bool(self._pending)
            if waiting or time.monotonic() - last >= self.heartbeat_s:
                self.flush()
                last = time.monotonic()

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the thread, then send what waits, retrying until ``timeout`` seconds have passed.

        Returns:
            ``True`` when the manager has every event (or the job is gone).
        """
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        while True:
            if self.flush() or self.gone:
                break
            if time.monotonic() >= deadline:
                with self._lock:
                    left = len(self._pending)
                log.error("the manager did not take %d events before the learner exited", left)
                break
            time.sleep(0.2)  # the manager is unreachable: retry a few times before giving up
        self._http.close()
        with self._lock:
            return not self._pending
