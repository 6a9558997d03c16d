"""The embedded manager (labswarm.manager.server.EmbeddedServer) with a real app and uvicorn: the port it picks is
held from its construction, so no other process of the machine can take it before it listens."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
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
