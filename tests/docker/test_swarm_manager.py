"""The manager's own container killed mid-session, against the engine of ``.ci/docker``: the manager is a swarm
service of the image (tests/docker/service_manager.py), its sessions' workers a service it made; ``docker kill``
of its container: swarm starts a new one on the same state, the session resumes from its persisted cursor while
the workers go on, and it completes with every sample once in the ledger (done, or cached: computed before the
kill, its outcome lost with the manager) and every array in the store (what tests/queue/test_no_loss.py's manager
restart asserts with processes, here with containers).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import docker, wait_for
from helpers import missing
from host_manager import task_states
from service_manager import ServiceManager


@pytest.fixture
def service_manager(engine: None, image: str, shared: Path) -> Iterator[ServiceManager]:
    state = docker("info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "active":
        missing(f"the engine is not in a swarm ({state}): bash .ci/docker swarm")
    manager = ServiceManager(shared, image, tones=32)  # 96 samples: the kill lands mid-session
    try:
        yield manager
    finally:
        manager.close()


def test_the_managers_container_killed_mid_session_is_restarted_and_nothing_is_lost(
        service_manager: ServiceManager) -> None:
    m = service_manager
    m.start(workers=2)
    wait_for("2 worker containers running", lambda: len(m.containers()) == 2, 300, interval=0.5)
    at_kill = m.wait_progress("3 outcomes", lambda p: p["finished"] >= 3)
    (victim,) = m.manager_containers()
    docker("kill", victim)
    assert at_kill["finished"] < m.total, "the session ended before the kill: nothing was mid-session"

    wait_for("a new manager container", lambda: m.manager_containers() and victim not in m.manager_containers(),
             300, interval=1.0)
    failed = [t for t in task_states(m.manager_service) if t["DesiredState"] == "Shutdown" and "137" in t["Error"]]
    assert len(failed) == 1, task_states(m.manager_service)
    m.wait_answers()
    resumed = m.progress()
    assert resumed["status"] in ("running", "completed"), resumed
    assert resumed["finished"] >= at_kill["finished"], (at_kill, resumed)  # the ledger outlived the container

    progress = m.wait_progress("the end of the session", lambda p: p["status"] == "completed")
    m.assert_every_sample_done_once(progress, resumed=True)
    wait_for(f"{m.service} removed at the session's end", m.service_gone, 120, interval=1.0)
