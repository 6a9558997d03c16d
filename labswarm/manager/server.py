"""Serving the manager: in a thread of this process (embedded default) or as its own process."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from labswarm.errors import ManagerError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on ``host``."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedServer:
    """Runs an ASGI app with uvicorn in a background thread.

    Args:
        app: the FastAPI app.
        host: interface to bind.
        port: TCP port; 0 picks a free one.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                     lifespan="on", access_log=False))
        self._thread = threading.Thread(target=self._server.run, name="labswarm-manager", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedServer:
        """Start serving; returns once the server accepts connections.

        Raises:
            ManagerError: it did not start within ``timeout`` seconds.
        """
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ManagerError(f"the embedded manager did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Shut down (the lifespan stops the session publishers)."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
