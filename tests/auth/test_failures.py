"""A flood of wrong tokens (labswarm.auth.failures): on the manager's real app and real SQLite engine, 300
different wrong tokens of the issued shape from one address cost exactly ``auth_failure_burst`` database lookups
plus the lookup budget's burst (a quarter of it) (counted by a SQLAlchemy event listener on the statement the
scoped-token hook runs), the rest are answered 429 with Retry-After; the admin's valid token from the same address
and another address's wrong token still get their usual answers during the flood; the bucket refills at its rate.
A learner's valid attempt token from 127.0.0.1 is accepted after that address presented 600 stale (revoked)
attempt tokens, which cost one lookup each (the negative cache), not one per request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from helpers import attempt_token_lookups
from sqlalchemy.orm import Session

from labswarm.auth.failures import FailureBudget, lookup_budget, retry_after
from labswarm.auth.tokens import hash_token, new_token
from labswarm.jobs.records.models import AttemptRow, JobRow
from labswarm.manager.api import create_app
from labswarm.settings import Settings

ADMIN = "admin-token-for-the-failures-test"
BURST = 20
LOOKUP_BURST = lookup_budget(FailureBudget(BURST, 0.001)).burst  # 5


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[FastAPI, list[str]]]:
    """The manager's app, its budget nearly without refill (0.001/s: the count does not depend on the machine's
    speed), and the attempt-token lookups its engine runs."""
    app = create_app(Settings(home=tmp_path / "home", api_token=ADMIN, data_roots=[tmp_path],
                              auth_failure_burst=BURST, auth_failure_rate=0.001))
    engine = app.state.sessions.engine
    try:
        with attempt_token_lookups(engine) as lookups:
            yield app, lookups
    finally:
        engine.dispose()


def _flood(app: FastAPI, requests: list[tuple[str, str]], route: str = "/v1/jobs") -> list[httpx.Response]:
    """GET ``route`` (or POST it, given as ``"POST /path"``) with each (client address, token) in turn, over the
    app's ASGI interface."""
    method, _, path = route.rpartition(" ")

    async def main() -> list[httpx.Response]:
        answers = []
        for address, token in requests:
            transport = httpx.ASGITransport(app=app, client=(address, 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
                answers.append(await http.request(method or "GET", path, json={} if method else None,
                                                  headers={"Authorization": f"Bearer {token}"}))
        return answers

    return asyncio.run(main())


def test_a_flood_of_wrong_tokens_costs_burst_lookups_and_valid_users_still_get_in(manager) -> None:
    app, lookups = manager
    attacker, other = "203.0.113.7", "198.51.100.2"
    requests = []
    for i in range(300):
        requests.append((attacker, new_token()))  # a different token each time: the negative cache cannot help
        if i % 50 == 49:
            requests.append((attacker, ADMIN))  # a valid user behind the same address (a NAT)
    requests.append((other, new_token()))
    answers = _flood(app, requests)
    codes = [a.status_code for a in answers]
    wrong = [a.status_code for (address, token), a in zip(requests, answers, strict=True)
             if address == attacker and token != ADMIN]
    assert wrong[:BURST] == [401] * BURST and wrong[BURST:] == [429] * (300 - BURST)
    # the attacker's budget, its lookup budget past it, and the other client's one try
    assert len(lookups) == BURST + LOOKUP_BURST + 1, len(lookups)
    assert [a.status_code for (_, token), a in zip(requests, answers, strict=True) if token == ADMIN] == [200] * 6
    assert codes[-1] == 401  # another address has its own budget
    refused = next(a for a in answers if a.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1 and "too many wrong API tokens" in refused.json()["detail"]


def test_the_budget_refills_at_its_rate_and_forgets_the_oldest_clients() -> None:
    now = [0.0]
    budget = FailureBudget(burst=2, rate=0.5, clients=2, clock=lambda: now[0])
    for _ in range(2):
        assert budget.wait("a") is None
        budget.charge("a")
    assert budget.wait("a") == pytest.approx(2.0)  # one token back after 1 / 0.5 s
    now[0] = 1.0
    assert budget.wait("a") == pytest.approx(1.0)
    now[0] = 2.0
    assert budget.wait("a") is None
    budget.charge("a")
    assert budget.wait("a") == pytest.approx(2.0)
    budget.charge("b")
    budget.charge("c")  # three clients, two remembered: "a" (the least recently charged) starts afresh
    assert budget.wait("a") is None
    assert retry_after(0.01) == "1" and retry_after(2.2) == "3"


def test_a_learner_is_accepted_from_an_address_that_presented_many_stale_attempt_tokens(manager) -> None:
    app, lookups = manager
    learner = new_token()
    digest = hash_token(learner).hex()
    with Session(app.state.sessions.engine) as db:  # a live attempt, its token's digest as deploy stores it
        db.add(JobRow(id="j1", name="j1", status="failed", experiment="e", manifest={}, owner="alice"))
        db.flush()
        db.add(AttemptRow(job_id="j1", number=1, token_sha256=digest))
        db.commit()
    route = "POST /v1/jobs/j1/attempts/1/reports"
    stale = [new_token() for _ in range(3)]  # three revoked attempts' learners, still reporting from loopback
    flood = [("127.0.0.1", stale[i % 3]) for i in range(600)]
    answers = _flood(app, [*flood, ("127.0.0.1", learner)], route)
    assert [a.status_code for a in answers[:BURST]] == [401] * BURST
    assert {a.status_code for a in answers[BURST:-1]} == {429}  # past the budget: told to back off
    assert answers[-1].status_code not in (401, 429), answers[-1].text  # the valid learner's report gets in
    assert len(lookups) == 3 + 1, len(lookups)  # each stale token once (negative cache), and the learner's
    # a flood of *different* issued-shape tokens drains the lookup budget too: then even a valid token waits
    before = len(lookups)
    answers = _flood(app, [("127.0.0.1", new_token()) for _ in range(50)] + [("127.0.0.1", learner)], route)
    assert len(lookups) - before == LOOKUP_BURST
    assert answers[-1].status_code == 429 and int(answers[-1].headers["Retry-After"]) >= 1
