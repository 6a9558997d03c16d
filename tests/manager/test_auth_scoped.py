"""Scoped tokens (Authenticator.add_scoped): the hook is asked only about a token no configured token matches,
gets its SHA-256 and never the token, and the user it answers opens its one request (method and path) and no other
(401), through the app-wide BearerAuth dependency; raw ASGI requests."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI

from labswarm.auth.authenticator import Authenticator, BearerAuth, current_user
from labswarm.auth.tokens import TokenEntry, User, hash_token

ADMIN = "admin-token-1"
SCOPED = "scoped-token-2-of-the-issued-shape-43-chars"  # the shape of new_token(): hooks see no other
WRONG = "wrong-token-of-the-issued-shape-43-chars-xx"


def _app() -> tuple[FastAPI, list[bytes]]:
    asked: list[bytes] = []

    def hook(digest: bytes) -> User | None:
        asked.append(digest)
        return User("learner:j1:1", "user", scope="POST /jobs/j1/reports") if digest == hash_token(SCOPED) else None

    authenticator = Authenticator([TokenEntry(User("admin", "admin"), hash_token(ADMIN))])
    authenticator.add_scoped(hook)
    app = FastAPI(dependencies=[Depends(BearerAuth(authenticator))])

    @app.post("/jobs/{job_id}/reports")
    def report(job_id: str, user: Annotated[User, Depends(current_user)]) -> dict[str, str | None]:
        return {"job": job_id, "name": user.name, "scope": user.scope}

    @app.get("/jobs/{job_id}/reports")
    def read(job_id: str) -> dict[str, str]:
        return {"job": job_id}

    return app, asked


def _send(app: FastAPI, method: str, path: str, token: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
            return await http.request(method, path, headers={"Authorization": f"Bearer {token}"})

    return asyncio.run(main())


def test_a_scoped_token_opens_its_one_request_only() -> None:
    app, asked = _app()
    ok = _send(app, "POST", "/jobs/j1/reports", SCOPED)
    assert ok.status_code == 200 and ok.json() == {"job": "j1", "name": "learner:j1:1",
                                                   "scope": "POST /jobs/j1/reports"}
    assert asked == [hash_token(SCOPED)]  # the digest, not the token
    for method, path in (("POST", "/jobs/j2/reports"), ("GET", "/jobs/j1/reports"), ("POST", "/jobs/j11/reports")):
        refused = _send(app, method, path, SCOPED)
        assert refused.status_code == 401, (method, path, refused.text)
        assert refused.headers["www-authenticate"].startswith("Bearer")


def test_the_hook_is_asked_only_when_no_configured_token_matches() -> None:
    app, asked = _app()
    assert _send(app, "GET", "/jobs/j2/reports", ADMIN).status_code == 200  # the admin: any request
    assert asked == []
    assert _send(app, "POST", "/jobs/j1/reports", WRONG).status_code == 401
    assert asked == [hash_token(WRONG)]


def test_the_hook_is_asked_in_a_thread_off_the_event_loop() -> None:
    """A hook may query a database: it runs in a worker thread, never on the loop that serves the requests (the
    dependency itself is async, and authenticates a configured token on the loop: issue 25)."""
    hooks: list[threading.Thread] = []
    loops: list[threading.Thread] = []
    authenticator = Authenticator([TokenEntry(User("admin", "admin"), hash_token(ADMIN))])
    authenticator.add_scoped(lambda digest: hooks.append(threading.current_thread()))
    app = FastAPI(dependencies=[Depends(BearerAuth(authenticator))])

    @app.get("/status")
    async def status() -> dict[str, str]:
        loops.append(threading.current_thread())
        return {}

    assert _send(app, "GET", "/status", WRONG).status_code == 401
    assert _send(app, "GET", "/status", ADMIN).status_code == 200
    assert len(hooks) == 1 and len(loops) == 1 and hooks[0] is not loops[0]
