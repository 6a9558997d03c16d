"""Wrong tokens do not cost a database query each (the scoped-token hook of the training jobs looks up the live
attempts' digests): a token not of the issued shape is never looked up, a wrong one of that shape once per
UNKNOWN_TTL; an attempt's token opens its route right after it is issued and fails at once when revoked. On the
manager's real app and real SQLite engine, the queries counted by a SQLAlchemy event listener."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from helpers import attempt_token_lookups

from labswarm.auth.authenticator import ISSUED_TOKEN, UNKNOWN_SIZE, UnknownTokens
from labswarm.auth.tokens import new_token
from labswarm.jobs.records.credentials import new_attempt_token
from labswarm.jobs.records.models import AttemptRow, JobRow
from labswarm.manager.api import create_app
from labswarm.settings import Settings

ADMIN = "admin-token-for-the-unknown-tokens-test"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[FastAPI, list[str]]]:
    """The manager's app (no lifespan: no lifecycle thread touches the attempts) and the statements its engine
    runs that look up an attempt token."""
    app = create_app(Settings(home=tmp_path / "home", api_token=ADMIN, data_roots=[tmp_path]))
    engine = app.state.sessions.engine
    try:
        with attempt_token_lookups(engine) as lookups:
            yield app, lookups
    finally:
        engine.dispose()


def _post(app: FastAPI, path: str, token: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
            return await http.post(path, headers={"Authorization": f"Bearer {token}"},
                                   json={"rank": 0, "progress": None, "events": []})

    return asyncio.run(main())


def test_a_wrong_token_is_looked_up_once_per_ttl_and_a_malformed_one_never(manager) -> None:
    app, lookups = manager
    app.state.auth.unknown = UnknownTokens(ttl=3600.0)  # "within the TTL" whatever the machine's load
    wrong = new_token()
    for _ in range(3):
        assert _post(app, "/v1/jobs/j1/attempts/1/reports", wrong).status_code == 401
    assert len(lookups) == 1, lookups  # within UNKNOWN_TTL: the database was asked once
    for malformed in ("short", "x" * 44, "a" * 42 + "=", "wrong-token"):
        assert _post(app, "/v1/jobs/j1/attempts/1/reports", malformed).status_code == 401
    assert len(lookups) == 1, lookups  # not the shape of an issued token: never looked up
    app.state.auth.unknown = UnknownTokens(ttl=0.0)  # the entry expired
    assert _post(app, "/v1/jobs/j1/attempts/1/reports", wrong).status_code == 401
    assert len(lookups) == 2, lookups


def test_an_attempt_token_opens_at_once_after_issue_and_fails_at_once_when_revoked(manager) -> None:
    app, lookups = manager
    service = app.state.sessions
    token, digest = new_attempt_token()
    assert _post(app, "/v1/jobs/j1/attempts/1/reports", token).status_code == 401  # not issued yet
    app.state.auth.unknown = UnknownTokens()  # (a token presented before its row exists waits out the TTL)
    with service.db() as db:
        db.add(JobRow(id="j1", name="j1", status="running", experiment="e", manifest={}))
        db.flush()  # the job first (no relationship orders the two inserts)
        db.add(AttemptRow(job_id="j1", number=1, token_sha256=digest))
        db.commit()
    opened = _post(app, "/v1/jobs/j1/attempts/1/reports", token)
    assert opened.status_code not in (401, 500), opened.text  # authenticated (the route answers about the learner)
    assert _post(app, "/v1/jobs/j1/attempts/2/reports", token).status_code == 401  # its one route only
    with service.db() as db:
        db.get(AttemptRow, ("j1", 1)).token_sha256 = None  # what the end of an attempt does: revoked
        db.commit()
    before = len(lookups)
    assert _post(app, "/v1/jobs/j1/attempts/1/reports", token).status_code == 401
    assert len(lookups) == before + 1  # a positive answer is never kept


def test_the_unknown_tokens_are_bounded_and_expire() -> None:
    unknown = UnknownTokens(size=3, ttl=60.0)
    for digest in (b"a", b"b", b"c"):
        unknown.add(digest)
    assert b"a" in unknown  # now the newest used
    unknown.add(b"d")
    assert (b"a" in unknown, b"b" in unknown, b"c" in unknown, b"d" in unknown) == (True, False, True, True)
    assert len(unknown) == 3
    expired = UnknownTokens(ttl=0.0)
    expired.add(b"a")
    assert b"a" not in expired and len(expired) == 0
    assert UNKNOWN_SIZE == 1_024


def test_the_issued_shape_is_the_shape_of_new_tokens() -> None:
    assert all(ISSUED_TOKEN.match(new_token().encode()) for _ in range(200))
