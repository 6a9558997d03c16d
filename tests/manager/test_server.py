"""The embedded manager (labswarm.manager.server.EmbeddedServer) with a real app and uvicorn: the port it picks is
held from its construction, so no other process of the machine can take it before it listens; free_port picks
ports the kernel gives no other socket."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer, free_port
from labswarm.settings import Settings


def test_the_port_an_embedded_manager_picks_is_its_own_from_construction_to_stop(tmp_path: Path) -> None:
    server = EmbeddedServer(create_app(Settings(home=tmp_path / "home")))
    try:
        with socket.socket() as other, pytest.raises(OSError):  # another process tries it before the start
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", server.port))
            other.listen()
        server.start()
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
    finally:
        server.stop()
    with socket.socket() as after:  # closed with the server
        after.bind(("127.0.0.1", server.port))


def test_free_port_is_below_the_kernels_ephemeral_range_and_free() -> None:
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(start // 2 <= port < start for port in ports), ports  # no connect() or bind to 0 is given one
    assert len(ports) > 1  # at random, so two callers rarely pick the same
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
