"""What every labswarm Prometheus endpoint exposes besides its own series: the process and platform collectors
of ``prometheus_client`` (``process_*``: CPU seconds, resident memory, open file descriptors; ``python_info``;
``python_gc_*``) and ``labswarm_build_info`` (``version``, ``python_version``: 1), the build-info convention of
Prometheus' own exporters. Used by the manager's ``/metrics`` and the health controller's endpoint.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector


def labswarm_version() -> str:
    """The installed labswarm's version (``unknown`` when it runs from a tree that was never installed)."""
    try:
        return version("labswarm")
    except PackageNotFoundError:
        return "unknown"


def standard_registry() -> CollectorRegistry:
    """A new registry holding the process, platform and garbage-collector collectors and
    ``labswarm_build_info``; the caller registers its own collectors in it."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge("labswarm_build_info", "labswarm's version and Python's; always 1.", ["version", "python_version"],
          registry=registry).labels(labswarm_version(), platform.python_version()).set(1)
    return registry
