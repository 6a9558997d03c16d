"""Each attempt's own API token (labswarm.jobs.records.credentials), with real learner processes over real HTTP: a
manager
configured with a tokens file alone (no ``LABSWARM_API_TOKEN``) runs a user's job to COMPLETED on its learners'
attempt tokens; an attempt token lives in the learner's environment only (not its command line, not its spec file,
only its SHA-256 in the database), opens its own report route and no other, and is revoked when its attempt
ends."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from jobs.manager import learner_processes, manager, read_events, statuses, wait_until
from jobs.test_lifecycle import _UNTIL
from jobs.tiny import tiny_manifest
from labswarm.auth.tokens import add_token
from labswarm.jobs.records.models import AttemptRow


@pytest.fixture(autouse=True)
def _no_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager and its learners see no LABSWARM_API_TOKEN: only the tokens file; the manager's environment
    holds a scrape token and another secret of its own, which its learners must not inherit."""
    monkeypatch.delenv("LABSWARM_API_TOKEN", raising=False)
    monkeypatch.setenv("LABSWARM_METRICS_TOKEN", SCRAPE_SECRET)
    monkeypatch.setenv("LABSWARM_SOME_FUTURE_SECRET", "managers-own")


SCRAPE_SECRET = "scrape-token-of-the-manager"


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_manager_with_only_a_tokens_file_runs_a_user_s_job_to_completion(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    alice_token = add_token(tokens, "alice", "user")
    with manager(tmp_path, tokens_file=tokens) as m, _client(m.server.url, alice_token) as alice:
        assert m.jobs.settings.api_token is None
        created = alice.post("/v1/jobs", json=tiny_manifest(tmp_path, epochs=1))
        assert created.status_code == 201, created.text
        job = created.json()
        stream = read_events(alice, job["id"])
        metrics = alice.get(f"/v1/jobs/{job['id']}/metrics").json()["metrics"]
        with m.jobs.db() as db:
            [attempt] = db.scalars(select(AttemptRow).where(AttemptRow.job_id == job["id"]))
    assert statuses(stream) == ["queued", "pending", "running", "storing", "completed"]
    assert [r["epoch"] for r in metrics] == [1]  # the learner's reports were taken
    assert any(e["event"] == "log" and "learner exits with code 0" in e["data"]["line"] for e in stream)
    assert attempt.ended_at is not None and attempt.token_sha256 is None  # revoked


def _started(event: dict) -> bool:
    return event["event"] == "log" and "started" in event["data"]["line"]


def test_an_attempt_token_opens_its_own_report_route_only_until_its_attempt_ends(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    root_token = add_token(tokens, "root", "admin")

    def waiting(name: str) -> dict:
        return tiny_manifest(tmp_path, name=name, framework={
            "name": "command", "command": [sys.executable, "-c", _UNTIL, str(tmp_path / f"release-{name}"), "99"]})

    with manager(tmp_path, tokens_file=tokens, job_slots=2) as m, _client(m.server.url, root_token) as root:
        first, second = (root.post("/v1/jobs", json=waiting(name)).json() for name in ("first", "second"))
        for job in (first, second):
            read_events(root, job["id"], until=_started)
        [learner] = learner_processes(first["id"])
        [other] = learner_processes(second["id"])
        token = learner.environ()["LABSWARM_API_TOKEN"]
        assert token != other.environ()["LABSWARM_API_TOKEN"] and token != root_token
        assert token not in " ".join(learner.cmdline())  # `ps` does not show it
        inherited = learner.environ()
        assert "LABSWARM_METRICS_TOKEN" not in inherited and "LABSWARM_SOME_FUTURE_SECRET" not in inherited
        assert SCRAPE_SECRET not in " ".join(inherited.values()) and "PATH" in inherited
        spec = tmp_path / "home" / "jobs" / first["id"] / "attempt-1" / "learner-0.json"
        assert token not in spec.read_text()
        with m.jobs.db() as db:
            stored = db.scalar(select(AttemptRow.token_sha256).where(AttemptRow.job_id == first["id"]))
        assert stored == hashlib.sha256(token.encode()).hexdigest()

        own = f"/v1/jobs/{first['id']}/attempts/1/reports"
        body = {"rank": 0, "events": []}
        with httpx.Client(base_url=m.server.url, timeout=30) as http:
            def call(method: str, path: str, secret: str = token) -> int:
                return http.request(method, path, json=body if method in ("POST", "PATCH") else None,
                                    headers={"Authorization": f"Bearer {secret}"}).status_code

            assert call("POST", own) == 200  # its own route takes it (so the refusals below can fail)
            refused = {(method, path): call(method, path) for method, path in (
                ("POST", f"/v1/jobs/{second['id']}/attempts/1/reports"),  # another job's report route
                ("POST", f"/v1/jobs/{first['id']}/attempts/2/reports"),  # another attempt's
                ("GET", f"/v1/jobs/{first['id']}"), ("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{first['id']}/events"),
                ("PATCH", f"/v1/jobs/{second['id']}"), ("DELETE", f"/v1/jobs/{second['id']}"),
                ("POST", "/v1/jobs/validate"), ("GET", "/experiments"), ("GET", "/settings"), ("GET", "/metrics"))}
            assert set(refused.values()) == {401}, refused
            (tmp_path / "release-first").touch()
            assert statuses(read_events(root, first["id"]))[-1] == "completed"
            wait_until(lambda: not learner.is_running(), 30, "the first learner's exit")
            assert call("POST", own) == 401  # revoked with its attempt
            with m.jobs.db() as db:
                assert db.scalar(select(AttemptRow.token_sha256).where(AttemptRow.job_id == first["id"])) is None
            # the second job's learner still reports with its own token, and completes
            (tmp_path / "release-second").touch()
            assert statuses(read_events(root, second["id"]))[-1] == "completed"
