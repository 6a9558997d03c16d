"""Owners of training jobs (issue 11, item 2) over real HTTP with named tokens: a user's job is a 404 to another
user on every ``/v1/jobs/{job_id}...`` route (taken from the app's schema, so a route added later is swept too),
listed for its owner and for an admin; ``framework: command`` is an admin's only (403 for a user at create and
validate); ``labswarm jobs list`` shows the owner.

The jobs stay QUEUED (each asks for a GPU of a manager that has none): nothing trains."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
from typer.testing import CliRunner

from jobs.manager import manager
from jobs.tiny import tiny_manifest
from labswarm.auth.tokens import add_token
from labswarm.cli.jobs import jobs_app

#: A request body per method where the route wants one (the 404 must come from the owner check, not a 422).
_BODIES = {"PATCH": {"status": "halt"}, "POST": {"rank": 0, "events": []}}


def _tokens(tmp_path: Path) -> dict[str, str]:
    tokens = tmp_path / "tokens.yaml"
    return {name: add_token(tokens, name, role) for name, role in
            (("alice", "user"), ("bob", "user"), ("root", "admin"))}


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_user_s_job_is_a_404_to_another_user_on_every_route_and_listed_for_its_owner_and_admins(
        tmp_path: Path) -> None:
    tokens = _tokens(tmp_path)
    queued = tiny_manifest(tmp_path, resources={"gpus": 1})
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_gpus=0) as m:
        alice, bob, root = (_client(m.server.url, tokens[n]) for n in ("alice", "bob", "root"))
        created = alice.post("/v1/jobs", json=queued)
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["owner"] == "alice" and job["status"] == "queued"
        own = root.post("/v1/jobs", json={**queued, "name": "roots"}).json()
        routes = [(method.upper(), path.replace("{job_id}", job["id"]).replace("{attempt}", "1"))
                  for path, operations in m.server.app.openapi()["paths"].items()
                  if path.startswith("/v1/jobs/{job_id}") for method in operations]
        assert len(routes) >= 10  # show, patch, delete, attempts, logs, metrics, model, bundle, events, reports
        for method, path in routes:
            answer = bob.request(method, path, json=_BODIES.get(method))
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json()["detail"] == f"no job {job['id']!r}"  # the same answer as for no job at all
        # the owner and an admin reach it (so the sweep can fail); bob's DELETE deleted nothing
        for client in (alice, root):
            for path in ("", "/attempts", "/logs", "/metrics"):
                assert client.get(f"/v1/jobs/{job['id']}{path}").status_code == 200, path
        assert alice.get(f"/v1/jobs/{own['id']}").status_code == 404  # an admin's job is not a user's either
        # a user's token is not a learner's: reports on their own job are refused
        assert alice.post(f"/v1/jobs/{job['id']}/attempts/1/reports", json=_BODIES["POST"]).status_code == 403
        listed = {name: client.get("/v1/jobs").json() for name, client in
                  (("alice", alice), ("bob", bob), ("root", root))}
        runner = CliRunner()
        table = runner.invoke(jobs_app, ["list"], env={"LABSWARM_MANAGER_URL": m.server.url, "COLUMNS": "200",
                                                       "LABSWARM_API_TOKEN": tokens["root"]})
        assert alice.patch(f"/v1/jobs/{job['id']}", json={"status": "halt"}).json()["status"] == "halted"
        assert alice.delete(f"/v1/jobs/{job['id']}").status_code == 204
        for client in (alice, bob, root):
            client.close()
    assert [(j["id"], j["owner"]) for j in listed["alice"]["jobs"]] == [(job["id"], "alice")]
    assert listed["bob"] == {"jobs": [], "total": 0, "offset": 0, "limit": 50}
    assert {(j["id"], j["owner"]) for j in listed["root"]["jobs"]} == {(job["id"], "alice"), (own["id"], "root")}
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert any("owner" in line and "status" in line for line in lines), table.output
    assert any(job["id"] in line and "alice" in line for line in lines), table.output
    assert any(own["id"] in line and "root" in line for line in lines), table.output


def test_the_command_framework_is_an_admin_s_only(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path)
    command = tiny_manifest(tmp_path, resources={"gpus": 1},
                            framework={"name": "command", "command": [sys.executable, "-c", "print('hi')"]})
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_gpus=0) as m:
        alice, root = (_client(m.server.url, tokens[n]) for n in ("alice", "root"))
        refused = [alice.post(route, json=command) for route in ("/v1/jobs/validate", "/v1/jobs")]
        # the same manifest with the labswarm framework is a user's to submit
        plain = alice.post("/v1/jobs/validate", json={k: v for k, v in command.items() if k != "framework"})
        valid = root.post("/v1/jobs/validate", json=command)
        created = root.post("/v1/jobs", json=command)
        listed = root.get("/v1/jobs").json()
        alice.close()
        root.close()
    for answer in refused:
        assert answer.status_code == 403, answer.text
        reason = answer.json()["detail"]
        assert "framework.name" in reason and "only an admin" in reason and "alice" in reason
    assert plain.status_code == 200, plain.text
    assert valid.status_code == 200 and created.status_code == 201, (valid.text, created.text)
    assert [j["owner"] for j in listed["jobs"]] == ["root"]  # alice's refused submit created nothing
