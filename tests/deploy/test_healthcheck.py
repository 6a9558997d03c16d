"""The image's health check: finding the role's process and probing it (a real manager over HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labswarm.deploy import healthcheck
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings


@pytest.mark.parametrize(("cmdline", "expected"), [
    (["/opt/labswarm/bin/python", "/opt/labswarm/bin/labswarm", "manager", "--port", "8001"],
     ("manager", ["--port", "8001"])),
    (["/sbin/docker-init", "--", "labswarm", "worker", "--experiment", "x"], ("worker", ["--experiment", "x"])),
    (["python", "-m", "labswarm.cli", "health", "--manager", "http://m:8000"], ("health", ["--manager", "http://m:8000"])),
    (["labswarm", "health", "plot", "abc"], None),
    (["labswarm", "run", "exp.yml"], None),
    (["python", "-m", "labswarm.deploy.healthcheck"], None),
    (["/opt/labswarm/bin/python", "-m", "labswarm.jobs.learner.entry", "/w/spec.json"], ("learner", ["/w/spec.json"])),
    (["python", "-m", "labswarm.train.distributed.ps", "--shard", "0"], ("shard", ["--shard", "0"])),
    (["python", "-m", "labswarm.train.distributed.ps"], ("shard", [])),
    (["python", "labswarm.train.distributed.ps"], None),
    ([], None),
])
def test_role_of(cmdline: list[str], expected: tuple | None) -> None:
    assert healthcheck.role_of(cmdline) == expected


def test_find_prefers_the_wanted_role_and_the_lowest_pid() -> None:
    processes = [(30, ["labswarm", "worker"]), (7, ["sh"]), (12, ["labswarm", "manager"]), (9, ["labswarm", "worker"])]
    assert healthcheck.find(processes, None) == (9, "worker", [])
    assert healthcheck.find(processes, "manager") == (12, "manager", [])
    assert healthcheck.find(processes, "health") is None


def test_find_skips_the_init_process_for_the_role_it_starts() -> None:
    """Behind ``docker-init`` (compose's ``init: true``, swarm's services) PID 1's command line holds the role's:
    the role's process is its child, which holds the broker connection."""
    processes = [(1, ["/sbin/docker-init", "--", "labswarm", "worker", "--experiment", "x"]),
                 (7, ["/opt/labswarm/bin/python", "/opt/labswarm/bin/labswarm", "worker", "--experiment", "x"])]
    assert healthcheck.find(processes, None) == (7, "worker", ["--experiment", "x"])
    assert healthcheck.find(processes[:1], "worker") is None


def test_a_shard_is_healthy_once_it_listens() -> None:
    import socket

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert healthcheck.check("shard", process.pid, []) == "the shard listens on no port yet"
    finally:
        process.kill()
        process.wait()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert healthcheck.check("shard", os.getpid(), []) is None
    assert healthcheck.check("learner", os.getpid(), []) is None


def test_option() -> None:
    assert healthcheck.option(["--port", "9"], "--port") == "9"
    assert healthcheck.option(["--port=9"], "--port") == "9"
    assert healthcheck.option([], "--port", "8000") == "8000"


def test_manager_probe_against_a_real_manager(tmp_path: Path) -> None:
    with EmbeddedServer(create_app(Settings(home=tmp_path / "home"))) as server:
        assert healthcheck.check("manager", 0, ["--port", str(server.port)]) is None
    problem = healthcheck.check("manager", 0, ["--port", str(server.port)])
    assert problem is not None and f":{server.port}/health" in problem


def test_worker_check_wants_a_pool_and_a_connection() -> None:
    # this process has no children and (here) no established TCP connection of its own
    lonely = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert "pool has not started" in healthcheck.check("worker", lonely.pid, [])
    finally:
        lonely.kill()
        lonely.wait()
    assert "cannot inspect" in healthcheck.check_worker(2**22 + 12345)


def test_main_without_a_labswarm_process_is_unhealthy(capsys: pytest.CaptureFixture[str]) -> None:
    assert healthcheck.main(["nosuchrole"]) == 1
    assert "unknown role" in capsys.readouterr().out
    if not any((healthcheck.role_of(c) or ("",))[0] == "health" for c in _cmdlines()):
        assert healthcheck.main(["health"]) == 1
        assert "no labswarm health process" in capsys.readouterr().out


def _cmdlines() -> list[list[str]]:
    import psutil

    return [p.info["cmdline"] or [] for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid()]


def test_worker_with_a_pool_and_a_broker_connection_is_healthy() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as broker:
        port = broker.getsockname()[1]
        code = (f"import socket, subprocess, sys, time; s = socket.create_connection(('127.0.0.1', {port})); "
                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                "print('ready', flush=True); time.sleep(30)")
        worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert worker.stdout.readline().strip() == "ready"
            conn, _ = broker.accept()
            with conn:
                assert healthcheck.check_worker(worker.pid) is None
        finally:
            for child in __import__("psutil").Process(worker.pid).children():
                child.kill()
            worker.kill()
            worker.wait()
            worker.stdout.close()


def test_health_probe_against_a_metrics_endpoint_that_wants_a_scrape_token() -> None:
    """The health controller's check reads its liveness path, which needs no token, while /metrics does."""
    from prometheus_client import CollectorRegistry

    from labswarm.health.metrics_server import serve_metrics

    server, _thread = serve_metrics(CollectorRegistry(), 0, "127.0.0.1", token="scrape-token-0123")
    try:
        port = str(server.server_port)
        assert healthcheck.check("health", 0, ["health", "--metrics-port", port]) is None
        assert "401" in (healthcheck.probe(f"http://127.0.0.1:{port}/metrics") or "")
    finally:
        server.shutdown()
        server.server_close()
    assert healthcheck.check("health", 0, ["health", "--metrics-port", port]) is not None  # stopped: unhealthy


@pytest.mark.parametrize(("role", "host_option", "port_option"), [
    ("health", "--metrics-host", "--metrics-port"), ("manager", "--host", "--port")])
def test_probe_goes_to_the_address_the_process_binds(role: str, host_option: str, port_option: str) -> None:
    """A process bound to one address (not a wildcard) is probed there: 127.0.0.2 is a loopback address that
    127.0.0.1 does not reach (was: always 127.0.0.1, so a healthy process was reported unhealthy)."""
    from prometheus_client import CollectorRegistry

    from labswarm.health.metrics_server import serve_metrics

    server, _thread = serve_metrics(CollectorRegistry(), 0, "127.0.0.2")  # answers /health on both roles' path
    try:
        port = str(server.server_port)
        assert healthcheck.check(role, 0, [host_option, "127.0.0.2", port_option, port]) is None
        assert healthcheck.check(role, 0, [f"{host_option}=0.0.0.0", port_option, port]) is not None  # wildcard
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("host", "expected"), [
    (None, "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "[::1]"), ("10.1.2.3", "10.1.2.3"),
    ("fd00::5", "[fd00::5]"), ("manager.local", "manager.local")])
def test_probe_host(host: str | None, expected: str) -> None:
    assert healthcheck.probe_host(host) == expected
