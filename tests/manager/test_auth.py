"""Authentication of the manager: every route of the app (iterated, so a new one cannot slip through) refuses a
request without a token or with a wrong one, except ``/health``; malformed ``Authorization`` headers, sent as raw
bytes, are 401s; named tokens and roles; the open loopback default; a manager on another address without a
token generates one (a real ``labswarm manager`` process)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute

from labswarm.auth.authenticator import current_user, ensure_token, require_admin
from labswarm.auth.tokens import User, add_token
from labswarm.errors import ConfigError, ManagerError
from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer, free_port
from labswarm.settings import Settings

TOKEN = "t0ken-Of-the-admin_42"
PUBLIC = {"/health"}


def _with_whoami(app: FastAPI) -> FastAPI:
    """Two routes added after create_app, as a later router would be: the app-wide dependency covers them (named
    apart from the manager's own GET /v1/whoami: operation ids are the handlers' names and must be unique)."""

    @app.get("/test/whoami")
    def caller(user: Annotated[User, Depends(current_user)]) -> dict[str, str]:
        return {"name": user.name, "role": user.role}

    @app.get("/test/admin-only")
    def admin_only(user: Annotated[User, Depends(require_admin)]) -> dict[str, str]:
        return {"name": user.name}

    return app


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    tokens = tmp_path / "tokens.yaml"
    return _with_whoami(create_app(Settings(home=tmp_path / "home", api_token=TOKEN, tokens_file=tokens,
                                            metrics_token="scrape-me")))


@pytest.fixture
def server(app: FastAPI) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(app) as running:
        yield running


def _asgi(app: FastAPI, requests: list[tuple[str, list]], client: tuple[str, int] = ("127.0.0.1", 40000)
          ) -> list[httpx.Response]:
    """GET each (path, raw headers) straight into the ASGI app: the header bytes arrive as given (nothing on
    the way strips or re-encodes them); ``client`` is the peer address the app sees."""

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
            return [await http.get(path, headers=headers) for path, headers in requests]

    return asyncio.run(main())


def _api_routes(routes: list, prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every API route, into included routers (FastAPI >= 0.16x keeps them as nodes that hold
    the router and the include's prefix) and mounts."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path, set(route.methods)
        elif hasattr(route, "original_router"):
            context = getattr(route, "include_context", None)
            yield from _api_routes(route.original_router.routes, prefix + getattr(context, "prefix", ""))
        elif hasattr(route, "routes"):  # a Mount
            yield from _api_routes(route.routes, prefix + getattr(route, "path", ""))


def _requests(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every API route of the app, path parameters filled in."""
    routes = list(_api_routes(app.routes))
    # the walk misses nothing the schema knows (so it cannot go blind if FastAPI changes how it keeps routes)
    assert set(app.openapi()["paths"]) <= {path for path, _methods in routes}
    return [(method, re.sub(r"\{[^}]+\}", "x1", path)) for path, methods in routes for method in sorted(methods)]


def test_every_route_but_health_refuses_without_a_token_and_with_a_wrong_one(app: FastAPI,
                                                                             server: EmbeddedServer) -> None:
    requests = _requests(app)
    paths = {path for _method, path in requests}
    # the sweep covers what the issue names (and whatever was added since)
    assert {"/metrics", "/settings", "/experiments", "/sessions", "/sessions/x1", "/test/whoami"} <= paths
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        for method, path in requests:
            for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Bearer {TOKEN}x"}):
                response = http.request(method, path, headers=headers)
                if path in PUBLIC:
                    assert response.status_code == 200, (method, path)
                    continue
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.headers["www-authenticate"].startswith("Bearer"), (method, path)
        # the right token gets through (the sweep can fail: the same requests are not all 401 with it)
        good = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/experiments", "/sessions", "/settings", "/metrics"):
            assert http.get(path, headers=good).status_code == 200, path
        assert http.get("/sessions/x1", headers=good).status_code == 404


def test_docs_and_schema_are_open_and_declare_the_bearer_scheme(server: EmbeddedServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        assert http.get("/docs").status_code == 200
        schema = http.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer",
        "description": "LABSWARM_API_TOKEN, or a named token of LABSWARM_TOKENS_FILE"}


MALFORMED = [
    b"",
    b"Bearer",
    b"Bearer ",
    b"bearer  " + TOKEN.encode(),  # two spaces
    b"Bearer\t" + TOKEN.encode(),
    b"Basic abc",
    b"Basic " + TOKEN.encode(),
    b"Token " + TOKEN.encode(),
    b"Bearer " + TOKEN.encode() + b" extra",
    b"Bearer " + TOKEN.encode() + b" ",  # a trailing space (HTTP servers strip it on the wire, RFC 9110 OWS)
    b"Bearer " + TOKEN.upper().encode(),  # the token is exact: a wrongly cased token is another token
    b"Bearer " + "t0ken-Öf-the-admin_42".encode(),
    b"Bearer \xff\xfe\x00",
    b"Bearer t\xe9st",  # latin-1, as Starlette would decode it
    "Bearer ÿ".encode("latin-1"),
]


@pytest.mark.parametrize("value", MALFORMED, ids=repr)
def test_malformed_headers_are_401_not_500(app: FastAPI, value: bytes) -> None:
    """Raw bytes straight into the ASGI app (nothing strips or re-encodes them on the way)."""
    [response] = _asgi(app, [("/settings", [(b"Authorization", value)])])
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("value", [b"Bearer \xe9t\xe9", b"Bearer " + "jeton-\u00e9".encode(), b"Basic \xff",
                                   b"bearer  " + TOKEN.encode(), b"Bearer"], ids=repr)
def test_malformed_headers_over_real_http(server: EmbeddedServer, value: bytes) -> None:
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        response = http.get("/experiments", headers=[(b"Authorization", value)])
    assert response.status_code == 401, response.text


def test_scheme_is_case_insensitive_and_two_headers_are_refused(app: FastAPI) -> None:
    schemes = (b"Bearer", b"bearer", b"BEARER", b"bEaReR")
    responses = _asgi(app, [("/test/whoami", [(b"Authorization", scheme + b" " + TOKEN.encode())])
                            for scheme in schemes])
    assert [r.json() for r in responses] == [{"name": "admin", "role": "admin"}] * len(schemes)
    [twice] = _asgi(app, [("/test/whoami", [(b"Authorization", f"Bearer {TOKEN}".encode())] * 2)])
    assert twice.status_code == 401


def test_named_tokens_roles_and_the_scrape_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    alice = add_token(tokens, "alice", "user")
    root = add_token(tokens, "root2", "admin")
    app = _with_whoami(create_app(Settings(home=tmp_path / "home", tokens_file=tokens, metrics_token="scrape-me")))

    def get(path: str, token: str) -> httpx.Response:
        return _asgi(app, [(path, [(b"Authorization", f"Bearer {token}".encode())])])[0]

    assert get("/test/whoami", alice).json() == {"name": "alice", "role": "user"}
    assert get("/test/admin-only", alice).status_code == 403
    assert get("/test/admin-only", root).json() == {"name": "root2"}
    assert get("/experiments", alice).status_code == 200
    # the scrape token opens /metrics and nothing else
    assert get("/metrics", "scrape-me").status_code == 200
    assert get("/experiments", "scrape-me").status_code == 401
    assert get("/test/whoami", "scrape-me").status_code == 401
    # a tokens file alone closes the manager: the open loopback default is gone
    assert _asgi(app, [("/experiments", [])])[0].status_code == 401


def test_a_token_no_header_can_carry_is_refused_at_start(tmp_path: Path) -> None:
    for bad in ("trailing ", "two words", "caf\u00e9"):
        with pytest.raises(ConfigError, match="api_token"):
            create_app(Settings(home=tmp_path / "home", api_token=bad))


def test_without_a_token_only_loopback_clients_get_in(tmp_path: Path) -> None:
    app = _with_whoami(create_app(Settings(home=tmp_path / "home")))
    with EmbeddedServer(app) as server, httpx.Client(base_url=server.url, timeout=10.0) as http:
        assert http.get("/test/whoami").json() == {"name": "local", "role": "admin"}
    for client, status in ((("127.0.0.1", 5000), 200), (("::1", 5000), 200), (("10.1.2.3", 5000), 401),
                           (("192.168.0.7", 5000), 401)):
        experiments, health = _asgi(app, [("/experiments", []), ("/health", [])], client=client)
        assert experiments.status_code == status, client
        assert health.status_code == 200


def test_an_open_manager_is_not_served_beyond_loopback(tmp_path: Path) -> None:
    with pytest.raises(ManagerError, match="without an API token"):
        EmbeddedServer(create_app(Settings(home=tmp_path / "home")), host="0.0.0.0")


def test_ensure_token(tmp_path: Path) -> None:
    import io

    plain = Settings(home=tmp_path)
    out = io.StringIO()
    assert ensure_token(plain, "127.0.0.1", out).api_token is None
    assert ensure_token(plain, "localhost", out).api_token is None and out.getvalue() == ""
    generated = ensure_token(plain, "0.0.0.0", out).api_token
    assert generated and len(generated) >= 40 and out.getvalue().count(generated) == 1
    assert ensure_token(Settings(home=tmp_path, api_token="mine"), "0.0.0.0", out).api_token == "mine"
    # a tokens file alone: a token for the manager's own local workers, printed nowhere
    tokens = tmp_path / "tokens.yaml"
    add_token(tokens, "alice")
    quiet = io.StringIO()
    assert ensure_token(Settings(home=tmp_path, tokens_file=tokens), "127.0.0.1", quiet).api_token
    assert quiet.getvalue() == ""


def test_manager_on_a_public_address_without_a_token_generates_one(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABSWARM_")}
    env["LABSWARM_HOME"] = str(tmp_path / "home")
    process = subprocess.Popen([sys.executable, "-m", "labswarm.cli", "manager", "--host", "0.0.0.0",
                                "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    try:
        token = None
        deadline = time.monotonic() + 60
        lines = []
        while token is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if lines[-2:-1] and "Authorization: Bearer" in lines[-2]:
                token = line.strip()
        assert token, "".join(lines)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10.0) as http:
            while True:  # the token is printed before uvicorn binds
                try:
                    http.get("/health")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the manager did not start"
                    time.sleep(0.1)
            assert http.get("/sessions").status_code == 401
            assert http.get("/sessions", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        process.terminate()
        process.wait(30)
        rest = process.stderr.read()
        process.stderr.close()
    assert token not in rest  # printed once
