"""Serving the manager: in a thread of this process (embedded default) or as its own process."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import uvicorn
from fastapi import FastAPI

from labswarm.errors import ManagerError
from labswarm.ports import free_port

__all__ = ["EmbeddedServer", "advertise", "free_port", "local_url"]


def local_url(host: str, port: int) -> str:
    """The URL at which processes on this machine reach a server bound to ``host:port`` (a wildcard address is
    reached through the loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def advertise(app: FastAPI, url: str) -> None:
    """Tell the app's session service, before it serves, the URL at which processes on this machine reach it: the
    ``local`` launcher passes it to the workers it starts (see :class:`~labswarm.deploy.base.Host`). An app
    without a session service (``app.state.sessions``) is left as it is."""
    sessions = getattr(app.state, "sessions", None)
    if sessions is not None:
        sessions.launchers.host = replace(sessions.launchers.host, manager_url=url)


def release(app: FastAPI, timeout: float = 30.0) -> None:
    """When the serving process stops: stop the workers it runs itself (sessions with ``launcher: local``)."""
    sessions = getattr(app.state, "sessions", None)
    if sessions is not None:
        sessions.launchers.close(timeout)


def _check_bind(app: FastAPI, host: str) -> None:
    from labswarm.auth.authenticator import check_bind

    check_bind(getattr(app.state, "auth", None), host)


def serve(app: FastAPI, host: str, port: int, access_log: bool = True) -> None:
    """Serve ``app`` on ``host:port`` in this thread until interrupted (``labswarm manager``, ``labswarm serve``);
    the local workers it started are stopped when it returns. ``access_log``: uvicorn's line per request on stderr
    (its default, on; ~0.15 ms of the event loop a request, measured on the prediction endpoint).

    Raises:
        ManagerError: the app has no token (open to loopback only) and ``host`` is not a loopback address.
    """
    _check_bind(app, host)
    advertise(app, local_url(host, port))
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)
    finally:
        release(app)


class EmbeddedServer:
    """Runs an ASGI app with uvicorn in a background thread.

    The manager's URL is advertised to the app (:func:`advertise`) at construction, and the local workers it runs
    are stopped by :meth:`stop`.

    Args:
        app: the FastAPI app.
        host: interface to bind.
        port: TCP port; 0: one the kernel picks, bound at construction and held until the server listens on it
            (a port chosen free and bound later, after the lifespan's start-up, could be taken meanwhile by another
            process of the machine).

    Raises:
        ManagerError: the app has no token (open to loopback only) and ``host`` is not a loopback address.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        _check_bind(app, host)
        self.host = host
        self._socket: socket.socket | None = None
        if not port:
            self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            self._socket.bind((host, 0))  # no SO_REUSEADDR: no other socket can bind it until it is closed
            port = self._socket.getsockname()[1]
        self.port = port
        self.app = app
        advertise(app, self.url)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                     lifespan="on", access_log=False))
        sockets = None if self._socket is None else [self._socket]
        self._thread = threading.Thread(target=self._server.run, args=(sockets,), name="labswarm-manager",
                                        daemon=True)

    @property
    def url(self) -> str:
        return local_url(self.host, self.port)

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
        """Shut down (the lifespan stops the session publishers), then stop the local workers the manager ran."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._socket is not None:
            self._socket.close()  # uvicorn closed it if it served; not if it was never started
        release(self.app)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
