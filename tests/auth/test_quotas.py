"""Per-user quotas (labswarm.auth.quotas) on a real manager (uvicorn, SQLite, named tokens over HTTP): a
submission past ``queued_jobs`` is a 429 naming the quota; a job past ``running_learners`` waits with the reason
in the API's job view and ``labswarm jobs show`` while another user's job takes the free slot; a session start
past ``active_sessions`` is a 429; the tokens file's weights and quotas are read, checked and kept by ``tokens add``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import yaml
from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from train.three_classes import training_experiment
from typer.testing import CliRunner

from labswarm.auth.quotas import Policies, Policy
from labswarm.auth.tokens import add_token, load_tokens
from labswarm.cli.jobs import jobs_app
from labswarm.errors import ConfigError
from labswarm.settings import Settings

_UNTIL = "import os, sys, time\nprint('started', flush=True)\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def _tokens(tmp_path: Path, quotas: dict[str, dict], role: str = "user") -> dict[str, str]:
    """Tokens of alice, bob (``role``) and root (admin); then ``quotas`` written into the users' entries."""
    path = tmp_path / "tokens.yaml"
    tokens = {name: add_token(path, name, r) for name, r in (("alice", role), ("bob", role), ("root", "admin"))}
    data = yaml.safe_load(path.read_text())
    for entry in data["tokens"]:
        if entry["name"] in quotas:
            entry["quotas"] = quotas[entry["name"]]
    path.write_text(yaml.safe_dump(data))
    return tokens


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _waiting(tmp_path: Path, name: str) -> dict:
    return tiny_manifest(tmp_path, name=name, framework={
        "name": "command", "command": [sys.executable, "-c", _UNTIL, str(tmp_path / "release")]})


def test_a_submission_past_the_queued_jobs_quota_is_a_429_naming_it(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path, {"alice": {"queued_jobs": 2}})
    queued = tiny_manifest(tmp_path, resources={"gpus": 1})  # a GPU of a manager that has none: stays queued
    bobs = {**queued, "experiment": {**queued["experiment"], "name": "bobs"}}  # alice's experiment is hers
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_gpus=0) as m:
        alice, bob = _client(m.server.url, tokens["alice"]), _client(m.server.url, tokens["bob"])
        codes = [alice.post("/v1/jobs", json=queued).status_code for _ in range(2)]
        over = alice.post("/v1/jobs", json=queued)
        others = [bob.post("/v1/jobs", json=bobs).status_code for _ in range(3)]  # no quota of his own
        listed = alice.get("/v1/jobs").json()["total"]
        alice.close()
        bob.close()
    assert codes == [201, 201] and others == [201, 201, 201]
    assert over.status_code == 429, over.text
    assert "quota queued_jobs of alice reached: 2 jobs queued of 2 allowed" in over.json()["detail"]
    assert listed == 2  # nothing was queued by the refused submission


@pytest.mark.slow
def test_a_job_past_the_running_quota_waits_with_the_reason_shown_and_does_not_hold_others(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path, {"alice": {"running_learners": 1}}, role="admin")  # admins: command learners
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_slots=2) as m:
        alice, bob = _client(m.server.url, tokens["alice"]), _client(m.server.url, tokens["bob"])
        first = alice.post("/v1/jobs", json=_waiting(tmp_path, "a1")).json()
        read_events(alice, first["id"], until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
        second = alice.post("/v1/jobs", json=_waiting(tmp_path, "a2")).json()
        mine = _waiting(tmp_path, "b1")
        mine["experiment"]["name"] = "bobs"  # alice's experiment is hers
        bobs = bob.post("/v1/jobs", json=mine).json()  # after alice's second: takes the free slot
        read_events(bob, bobs["id"], until=lambda e: e["event"] == "log" and "started" in e["data"]["line"])
        waiting = alice.get(f"/v1/jobs/{second['id']}").json()
        shown = CliRunner().invoke(jobs_app, ["show", second["id"]], env={
            "LABSWARM_MANAGER_URL": m.server.url, "LABSWARM_API_TOKEN": tokens["alice"], "COLUMNS": "200"})
        (tmp_path / "release").touch()
        ends = [statuses(read_events(alice, job["id"]))[-1] for job in (first, second, bobs)]
        done = alice.get(f"/v1/jobs/{second['id']}").json()
        alice.close()
        bob.close()
    assert waiting["status"] == "queued"
    assert waiting["reason"].startswith("waiting: quota running_learners of alice reached: 1 learners holding"), \
        waiting["reason"]
    assert shown.exit_code == 0 and "quota running_learners of alice" in " ".join(shown.output.split())
    assert ends == ["completed"] * 3
    assert done["timestamps"]["pending"] > first["submitted_at"]


def test_a_session_past_the_active_sessions_quota_is_a_429(tmp_path: Path) -> None:
    tokens = _tokens(tmp_path, {"alice": {"active_sessions": 0}})
    tiny_manifest(tmp_path)  # writes the data set
    experiment = training_experiment(tmp_path / "data", tmp_path / "store")
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml") as m:
        alice = _client(m.server.url, tokens["alice"])
        registered = alice.post("/experiments", json=experiment)
        assert registered.status_code == 201, registered.text
        refused = alice.post(f"/experiments/{experiment['name']}/sessions", json={"launcher": "none"})
        alice.close()
    assert refused.status_code == 429, refused.text
    assert "quota active_sessions of alice reached" in refused.json()["detail"]


def test_the_tokens_file_s_weights_and_quotas_are_read_checked_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    _tokens(tmp_path, {"alice": {"queued_jobs": 3, "gpus": None}})
    data = yaml.safe_load(path.read_text())
    data["tokens"][0]["weight"] = 2.5
    path.write_text(yaml.safe_dump(data))
    settings = Settings(home=tmp_path, tokens_file=path, quota_running_learners=4, quota_gpus=1,
                        user_weights={"bob": 3.0})
    policies = Policies.from_settings(settings)
    assert policies.of("alice") == Policy(weight=2.5, running_learners=4, gpus=None, queued_jobs=3)
    assert policies.of("bob") == Policy(weight=3.0, running_learners=4, gpus=1)
    assert policies.of("carol") == Policy(running_learners=4, gpus=1)
    add_token(path, "carol")  # rewriting the file keeps alice's weight and quotas
    assert Policies.from_settings(settings).of("alice") == policies.of("alice")
    assert [e.user.name for e in load_tokens(path)] == ["alice", "bob", "root", "carol"]
    toml = tmp_path / "tokens.toml"
    add_token(toml, "dave")
    toml.write_text(toml.read_text() + '[[tokens]]\nname = "erin"\nrole = "user"\ntoken_sha256 = "' + "0" * 64
                    + '"\nweight = 2\nquotas = {running_learners = 1}\n')
    add_token(toml, "frank")
    toml_policies = Policies.from_settings(Settings(home=tmp_path, tokens_file=toml))
    assert toml_policies.of("erin") == Policy(weight=2.0, running_learners=1)
    data["tokens"][0]["quotas"] = {"queued_job": 3}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tokens\[0\]\.quotas\.queued_job"):
        Policies.from_settings(settings)
    data["tokens"][0]["quotas"] = {"queued_jobs": -1}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tokens\[0\]\.quotas\.queued_jobs"):
        Policies.from_settings(settings)


def test_a_job_that_could_never_start_is_refused_at_submission_naming_the_field(tmp_path: Path) -> None:
    """More learners than the owner's running_learners quota or the manager's job_slots, more GPUs than the
    owner's gpus quota: a 422 naming the field and the quota (it would wait forever, past job_slots holding the
    queue's head for every user); nothing queued. A job queued before job_slots shrank fails at the next pass."""
    tokens = _tokens(tmp_path, {"alice": {"running_learners": 1, "gpus": 1}})
    two = tiny_manifest(tmp_path, learners=2, framework={"name": "allreduce"})
    gpus = tiny_manifest(tmp_path, resources={"gpus": 2})
    three = {**tiny_manifest(tmp_path, learners=3, framework={"name": "allreduce", "batch": "per_learner"},
                             resources={"gpus": 1}),  # per_learner: 3 learners do not split the batch of 4
             "experiment": {**two["experiment"], "name": "bobs"}}
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_slots=3, job_gpus=0) as m:
        alice, bob = _client(m.server.url, tokens["alice"]), _client(m.server.url, tokens["bob"])
        refused = [alice.post("/v1/jobs", json=body) for body in (two, gpus)]
        held = bob.post("/v1/jobs", json=three)  # fits 3 slots; no GPU free (job_gpus 0): stays queued
        listed = alice.get("/v1/jobs").json()["total"]
        alice.close()
        bob.close()
    assert [r.status_code for r in refused] == [422, 422], [r.text for r in refused]
    assert [d["path"] for r in refused for d in r.json()["detail"]] == ["learners", "resources.gpus"]
    reasons = [d["reason"] for r in refused for d in r.json()["detail"]]
    assert "more than the running_learners quota of alice (1)" in reasons[0]
    assert "more than the gpus quota of alice (1)" in reasons[1]
    assert listed == 0 and held.status_code == 201, held.text
    with manager(tmp_path, tokens_file=tmp_path / "tokens.yaml", job_slots=2, job_gpus=0) as m:
        bob = _client(m.server.url, tokens["bob"])
        over = bob.post("/v1/jobs", json=three)
        ends = statuses(read_events(bob, held.json()["id"]))
        job = bob.get(f"/v1/jobs/{held.json()['id']}").json()
        bob.close()
    assert over.status_code == 422 and over.json()["detail"][0]["path"] == "learners", over.text
    assert "more than this manager's 2 learner slots (job_slots" in over.json()["detail"][0]["reason"]
    assert ends[-1] == "failed" and job["error_code"] == "C104", job
    assert "job_slots" in job["reason"], job
