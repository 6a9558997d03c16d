"""The health controller's Prometheus endpoint (labswarm.health.metrics_server): loopback by default, a scrape
token when asked, refused on another address without one. Real HTTP (its own server thread), the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from labswarm.errors import ConfigError
from labswarm.health.metrics_server import serve_metrics

TOKEN = "scrape-token-0123"


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("labswarm_health_rate", "Publish rate decided, tasks/s.", registry=registry).set(12.5)
    return registry


@pytest.fixture
def serve(registry: CollectorRegistry) -> Iterator:
    servers = []

    def start(host: str = "127.0.0.1", token: str | None = None):
        server, _thread = serve_metrics(registry, 0, host, token)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_it_binds_the_loopback_by_default(serve) -> None:
    server = serve()
    assert server.server_address[0] == "127.0.0.1"
    response = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5)
    assert response.status_code == 200 and "labswarm_health_rate 12.5" in response.text


@pytest.mark.parametrize("header", [None, b"Bearer wrong-token", b"bearer", b"Basic " + TOKEN.encode(),
                                    b"Bearer " + TOKEN.encode() + b"\xc3\xa9", b"Bearer  " + TOKEN.encode()])
def test_with_a_token_every_scrape_must_carry_it(serve, header: bytes | None) -> None:
    server = serve(token=TOKEN)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    refused = httpx.get(url, headers={} if header is None else {"Authorization": header}, timeout=5)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer"), refused.text
    assert "labswarm_health" not in refused.text and TOKEN not in refused.text
    accepted = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert accepted.status_code == 200 and "labswarm_health_rate 12.5" in accepted.text


def test_another_address_needs_a_token(serve) -> None:
    with pytest.raises(ConfigError, match="LABSWARM_METRICS_TOKEN") as caught:
        serve(host="0.0.0.0")
    assert caught.value.errors[0][0] == "metrics_host"
    server = serve(host="0.0.0.0", token=TOKEN)  # guarded: may listen beyond this machine
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    assert httpx.get(url, timeout=5).status_code == 401


def test_the_cli_refuses_an_open_endpoint_beyond_loopback() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABSWARM_METRICS_TOKEN")}
    result = subprocess.run([sys.executable, "-m", "labswarm.cli", "health", "--manager", "http://127.0.0.1:9",
                             "--metrics-port", "65531", "--metrics-host", "0.0.0.0"],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "LABSWARM_METRICS_TOKEN" in result.stderr and "metrics_host" in result.stderr, result.stderr


def test_health_needs_no_token(serve) -> None:
    server = serve(token=TOKEN)
    response = httpx.get(f"http://127.0.0.1:{server.server_port}/health", timeout=5)
    assert response.status_code == 200 and response.text == "ok\n"
