"""The manager's Prometheus registry (``GET /metrics``): the sessions' series
(:mod:`labswarm.sessions.metrics`), the training jobs' (:mod:`labswarm.jobs.service.metrics`), the process and
platform collectors and ``labswarm_build_info`` (:mod:`labswarm.exposition`). ``promtool check metrics`` finds
nothing to say about it (``tests/manager/test_prometheus.py``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from labswarm.exposition import standard_registry
from labswarm.jobs.service.metrics import JobCollector
from labswarm.jobs.service.service import JobService
from labswarm.sessions.metrics import SessionCollector
from labswarm.sessions.service import SessionService


def metrics_registry(sessions: SessionService, jobs: JobService) -> CollectorRegistry:
    """A registry collecting ``sessions`` and ``jobs`` at each scrape, with the standard collectors."""
    registry = standard_registry()
    registry.register(SessionCollector(sessions))
    registry.register(JobCollector(jobs))
    return registry
