"""The health controller's Prometheus endpoint (``labswarm health --metrics-port``), closed like the manager's.

It binds the loopback by default (``--metrics-host 127.0.0.1``, as Ray's dashboard does); with a scrape token
(``LABSWARM_METRICS_TOKEN``, or the file ``LABSWARM_METRICS_TOKEN_FILE`` names: the one the manager's
``/metrics`` accepts) every request must carry ``Authorization: Bearer <token>`` (parsed strictly, compared in
constant time as SHA-256 digests), and only then may it bind another address: an open endpoint is never served
beyond this machine. ``/health`` answers ``ok`` without a token (liveness: the container's health check).
"""

from __future__ import annotations

import hmac
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from labswarm.errors import ConfigError

#: Where the endpoint listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def scrape_guard(app: WSGIApp, token: str | None) -> WSGIApp:
    """``app`` answering only requests that carry ``Authorization: Bearer <token>`` (``/health`` aside);
    ``token`` ``None``: ``app``.

    A missing, malformed or wrong header is a 401 with ``WWW-Authenticate: Bearer``, never a 500.
    """
    if token is None:
        return app
    from starlette.exceptions import HTTPException

    from labswarm.auth.authenticator import bearer_token
    from labswarm.auth.tokens import hash_token

    expected = hash_token(token)

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/health":
            return app(environ, start_response)
        header = environ.get("HTTP_AUTHORIZATION")
        headers = [] if header is None else [(b"authorization", header.encode("latin-1"))]
        try:
            presented = bearer_token(headers)
            reason = None if hmac.compare_digest(hash_token(presented), expected) else "invalid token"
        except HTTPException as exc:
            reason = exc.detail
        if reason is None:
            return app(environ, start_response)
        body = f"401 unauthorized: {reason}\n".encode()
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("Content-Length", str(len(body))), ("WWW-Authenticate", "Bearer")])
        return [body]

    return guarded


def _with_health(app: WSGIApp) -> WSGIApp:
    """``app`` with ``GET /health`` answering ``ok`` (liveness)."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/health":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", "3")])
            return [b"ok\n"]
        return app(environ, start_response)

    return routed


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape)."""


def serve_metrics(registry: Any, port: int, host: str = DEFAULT_HOST,
                  token: str | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` as Prometheus text on ``host:port`` from a daemon thread.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``.
        port: TCP port; 0 picks a free one (``server.server_port``).
        host: the address to bind, :data:`DEFAULT_HOST` by default.
        token: the scrape token requests must carry (``LABSWARM_METRICS_TOKEN``); ``None``: none asked.

    Returns:
        The server (``shutdown()`` stops it) and its thread.

    Raises:
        ConfigError: ``host`` is not a loopback address and there is no token (field ``metrics_host``).
        OSError: the address cannot be bound.
    """
    from prometheus_client import make_wsgi_app

    from labswarm.auth.authenticator import is_loopback

    if token is None and not is_loopback(host):
        raise ConfigError([("metrics_host", f"refusing to serve the health controller's metrics on {host or '*'} "
                                            "(not loopback) without a scrape token: set LABSWARM_METRICS_TOKEN "
                                            "(or LABSWARM_METRICS_TOKEN_FILE), or keep --metrics-host 127.0.0.1")])
    server_class = _Server6 if ":" in host else _Server
    server = make_server(host, port, scrape_guard(_with_health(make_wsgi_app(registry)), token), server_class,
                         _Quiet)
    thread = threading.Thread(target=server.serve_forever, name="labswarm-health-metrics", daemon=True)
    thread.start()
    return server, thread
