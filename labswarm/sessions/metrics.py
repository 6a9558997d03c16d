"""Prometheus metrics of the manager (``GET /metrics``), read from the sessions' rows at scrape time.

Only the active sessions (running or paused) and the :data:`RECENT` most recently created ended ones are
collected, so a scrape (every second or so) costs the same however many sessions were ever run; their counts
are the counters each session row keeps with its ledger (one row read per session, whatever its size).

Series (labels ``session``, ``experiment``):

- ``labswarm_session_samples{status}``: samples per ledger status (``published`` = awaiting an outcome,
  ``done``, ``cached``, ``failed``);
- ``labswarm_session_total``: samples in the session;
- ``labswarm_session_published_total``: messages published (republished ones included);
- ``labswarm_session_publish_rate``: the publish rate in force, tasks/s;
- ``labswarm_session_active``: 1 while the session runs or is paused.
"""

from __future__ import annotations

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


#: Ended sessions collected besides the active ones, newest first.
RECENT = 10


class SessionCollector(Collector):
    """Collects the active and the :data:`RECENT` latest sessions' progress from a
    :class:`~labswarm.sessions.service.SessionService` when scraped."""

    def __init__(self, manager: SessionService) -> None:
        self.manager = manager

    def collect(self) -> Iterator:
        labels = ["session", "experiment"]
        samples = GaugeMetricFamily("labswarm_session_samples", "Samples per ledger status.",
                                    labels=[*labels, "status"])
        total = GaugeMetricFamily("labswarm_session_total", "Samples in the session.", labels=labels)
        published = CounterMetricFamily("labswarm_session_published", "Messages published.", labels=labels)
        rate = GaugeMetricFamily("labswarm_session_publish_rate", "Publish rate in force, tasks/s.", labels=labels)
        active = GaugeMetricFamily("labswarm_session_active", "1 while running or paused.", labels=labels)
        rows = {row.id: row for row in self.manager.sessions(ACTIVE, limit=1_000)}
        rows.update((row.id, row) for row in self.manager.sessions(ENDED, limit=RECENT))
        for row in rows.values():
            try:
                p = self.manager.progress_of(row)  # the row just read: no second read per session
            except NotFound:  # deleted before its first recount
                continue
            key = [p["id"], p["experiment"]]
            for status, field in (("published", "pending"), ("done", "done"), ("cached", "cached"),
                                  ("failed", "failed")):
                samples.add_metric([*key, status], p[field])
            total.add_metric(key, p["total"])
            published.add_metric(key, p["published"])
            rate.add_metric(key, p["rate"])
            active.add_metric(key, 1.0 if p["status"] in ACTIVE else 0.0)
        yield from (samples, total, published, rate, active)
