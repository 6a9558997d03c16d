"""Prometheus metrics of the manager (``GET /metrics``), read from the sessions' rows at scrape time.

Only the active sessions (running or paused) and the :data:`RECENT` most recently created ended ones are
collected, so a scrape (every second or so) costs the same however many sessions were ever run; their counts
are the counters each session row keeps with its ledger (one row read per session, whatever its size).

Series (labels ``session``, ``experiment``), named after Prometheus' naming guide (counters for what only grows,
``_total`` on counters only, the unit in the name; ``promtool check metrics`` is clean):

- ``labswarm_session_samples``: samples in the session (gauge);
- ``labswarm_session_pending_samples``: samples published and awaiting an outcome, in the queue or in a worker's
  hands (gauge);
- ``labswarm_session_outcomes_total{outcome}``: samples finished per outcome, ``done``, ``cached``, ``failed``
  (counter);
- ``labswarm_session_messages_published_total``: messages published, republished ones included (counter);
- ``labswarm_session_publish_rate_tasks_per_second``: the publish rate in force while the session runs, 0 once
  it is paused or has ended (gauge);
- ``labswarm_session_active``: 1 while the session runs or is paused (gauge);
- ``labswarm_session_workers``: workers the session's launcher runs now (gauge; absent when the manager runs
  none for it).

Renamed in issue 28 (the old names broke the conventions): ``labswarm_session_total`` (a gauge named like a
counter) is ``labswarm_session_samples``; ``labswarm_session_samples{status="published"}`` is
``labswarm_session_pending_samples``; ``labswarm_session_samples{status="done|cached|failed"}`` (gauges) is
``labswarm_session_outcomes_total{outcome}``; ``labswarm_session_published_total`` is
``labswarm_session_messages_published_total``; ``labswarm_session_publish_rate`` is
``labswarm_session_publish_rate_tasks_per_second``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from labswarm.errors import NotFound
from labswarm.sessions.states import ACTIVE, TERMINAL, SessionState

#: Statuses of an ended session (``completed``, ``cancelled``, ``failed``).
ENDED = tuple(state for state in SessionState if state in TERMINAL)

if TYPE_CHECKING:
    from labswarm.sessions.service import SessionService

log = logging.getLogger(__name__)


#: Ended sessions collected besides the active ones, newest first.
RECENT = 10


class SessionCollector(Collector):
    """Collects the active and the :data:`RECENT` latest sessions' progress from a
    :class:`~labswarm.sessions.service.SessionService` when scraped."""

    def __init__(self, manager: SessionService) -> None:
        self.manager = manager

    def collect(self) -> Iterator:
        labels = ["session", "experiment"]
        total = GaugeMetricFamily("labswarm_session_samples", "Samples in the session.", labels=labels)
        pending = GaugeMetricFamily("labswarm_session_pending_samples",
                                    "Samples published and awaiting an outcome.", labels=labels)
        outcomes = CounterMetricFamily("labswarm_session_outcomes", "Samples finished, per outcome.",
                                       labels=[*labels, "outcome"])
        published = CounterMetricFamily("labswarm_session_messages_published",
                                        "Messages published, republished ones included.", labels=labels)
        rate = GaugeMetricFamily("labswarm_session_publish_rate_tasks_per_second",
                                 "Publish rate in force while running (0 when paused or ended).", labels=labels)
        active = GaugeMetricFamily("labswarm_session_active", "1 while running or paused.", labels=labels)
        workers = GaugeMetricFamily("labswarm_session_workers", "Workers the session's launcher runs now.",
                                    labels=labels)
        rows = {row.id: row for row in self.manager.sessions(ACTIVE, limit=1_000)}
        rows.update((row.id, row) for row in self.manager.sessions(ENDED, limit=RECENT))
        for row in rows.values():
            try:
                p = self.manager.progress_of(row)  # the row just read: no second read per session
            except NotFound:  # deleted before its first recount
                continue
            key = [p["id"], p["experiment"]]
            total.add_metric(key, p["total"])
            pending.add_metric(key, p["pending"])
            for outcome in ("done", "cached", "failed"):
                outcomes.add_metric([*key, outcome], p[outcome])
            published.add_metric(key, p["published"])
            rate.add_metric(key, p["rate"] if p["status"] == SessionState.RUNNING else 0.0)
            active.add_metric(key, 1.0 if p["status"] in ACTIVE else 0.0)
            count = self._workers(p["id"]) if p["status"] in ACTIVE else None
            if count is not None:
                workers.add_metric(key, count)
        yield from (total, pending, outcomes, published, rate, active, workers)

    def _workers(self, session_id: str) -> int | None:
        launcher = self.manager.launchers.get(session_id)
        if launcher is None:
            return None
        try:
            return int(launcher.workers)
        except Exception as exc:  # a swarm engine that does not answer: no series rather than a failed scrape
            log.info("workers of session %s unknown: %s", session_id, exc)
            return None
