"""The quota admin API (labswarm.manager.quotas) and the workers quota on a real manager (uvicorn, named tokens over
HTTP, real local worker processes), on SQLite and PostgreSQL: a user gets 403; an admin reads a user's policy, sets
their weight and quotas (bad fields 422, named), and the new ones hold at once (a queued_jobs quota lowered: the
next submission is a 429 naming it; a workers quota: a session start or a scale past it is a 429, nothing
started); the overrides outlive the manager process, and removing them gives back the tokens file's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from helpers import experiment_dict, write_dataset
from jobs.manager import manager
from jobs.tiny import tiny_manifest

from labswarm.auth.tokens import add_token

pytestmark = pytest.mark.slow  # two managers and two local workers: ~20 s a database on the loaded machine

WORKERS_TOKEN = "quotas-workers-token-0123456789abcdef"


def _tokens(tmp_path: Path) -> dict[str, str]:
    """alice (user, tokens file: queued_jobs 5), root (admin)."""
    path = tmp_path / "tokens.yaml"
    tokens = {name: add_token(path, name, role) for name, role in (("alice", "user"), ("root", "admin"))}
    data = yaml.safe_load(path.read_text())
    data["tokens"][0]["quotas"] = {"queued_jobs": 5}
    path.write_text(yaml.safe_dump(data))
    return tokens


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _session(http: httpx.Client, experiment: str, workers: int) -> httpx.Response:
    # a rate so low that the session outlives the test: its workers stay wanted
    return http.post(f"/experiments/{experiment}/sessions", json={"rate": 0.01, "launcher": "local",
                                                                   "workers": workers})


def test_an_admin_sets_a_user_s_quotas_and_they_hold_at_once_and_after_a_restart(tmp_path: Path,
                                                                                 database_url: str) -> None:
    tokens = _tokens(tmp_path)
    queued = tiny_manifest(tmp_path, resources={"gpus": 1})  # a GPU of a manager that has none: stays queued
    dataset = write_dataset(tmp_path / "tones", n_per_label=2)
    settings = {"tokens_file": tmp_path / "tokens.yaml", "database_url": database_url, "job_gpus": 0,
                "api_token": WORKERS_TOKEN}
    with manager(tmp_path, **settings) as m:
        alice, root = _client(m.server.url, tokens["alice"]), _client(m.server.url, tokens["root"])
        forbidden = [alice.get("/v1/quotas"), alice.get("/v1/quotas/alice"),
                     alice.put("/v1/quotas/alice", json={"quotas": {"queued_jobs": 100}}),
                     alice.delete("/v1/quotas/alice")]
        before = root.get("/v1/quotas/alice").json()
        set_ = root.put("/v1/quotas/alice", json={"weight": 3, "quotas": {"queued_jobs": 1, "workers": 1}})
        bad = [root.put("/v1/quotas/alice", json={"quotas": {"queued_job": 1}}),
               root.put("/v1/quotas/alice", json={"weight": 0}),
               root.put("/v1/quotas/alice", json={"quotas": {"workers": -1}}),
               root.put("/v1/quotas/al%20ice", json={})]
        listed = root.get("/v1/quotas").json()
        weight = m.jobs.lifecycle.deployer.policies.weight("alice")  # what the scheduler's fair share reads
        submitted = [alice.post("/v1/jobs", json=queued) for _ in range(2)]

        for name in ("tones", "tones2"):
            registered = alice.post("/experiments", json=experiment_dict(dataset, tmp_path / "store", name=name))
            assert registered.status_code == 201, registered.text
        too_many = _session(alice, "tones", 2)
        none_started = alice.get("/sessions").json()
        first = _session(alice, "tones", 1)
        second_over = _session(alice, "tones2", 1)  # 1 + 1 > 1
        second = _session(alice, "tones2", 0)
        sid1, sid2 = first.json()["id"], second.json()["id"]
        scale_over = alice.put(f"/sessions/{sid2}/workers", json={"workers": 1})
        scale_down = alice.put(f"/sessions/{sid1}/workers", json={"workers": 0})
        scale_up = alice.put(f"/sessions/{sid2}/workers", json={"workers": 1})  # the one freed
        for sid in (sid1, sid2):
            assert alice.post(f"/sessions/{sid}/cancel").status_code == 200
        alice.close()
        root.close()
    assert [r.status_code for r in forbidden] == [403] * 4, [r.text for r in forbidden]
    assert before == {"user": "alice", "weight": 1.0, "overrides": {"weight": None, "quotas": {}},
                      "quotas": {"running_learners": None, "gpus": None, "queued_jobs": 5, "active_sessions": None,
                                 "workers": None}}
    assert set_.status_code == 200, set_.text
    assert set_.json()["weight"] == 3 and set_.json()["quotas"]["queued_jobs"] == 1, set_.json()
    assert set_.json()["overrides"] == {"weight": 3, "quotas": {"queued_jobs": 1, "workers": 1}}
    assert [r.status_code for r in bad] == [422] * 4, [r.text for r in bad]
    paths = [r.json()["detail"][0]["path"] for r in bad]
    assert paths == ["quotas.queued_job", "weight", "quotas.workers", "path.user"]
    assert listed["default"]["quotas"]["queued_jobs"] is None
    assert [(u["user"], u["weight"]) for u in listed["users"]] == [("alice", 3.0)]
    assert weight == 3.0
    assert [r.status_code for r in submitted] == [201, 429], [r.text for r in submitted]
    assert "quota queued_jobs of alice reached: 1 jobs queued of 1 allowed" in submitted[1].json()["detail"]
    assert too_many.status_code == 429 and "quota workers of alice reached: 0 workers" in too_many.text, too_many.text
    assert none_started == []  # refused before the session was made
    assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)
    assert second_over.status_code == 429 and "1 workers the manager runs for their sessions of 1 allowed" in \
        second_over.json()["detail"], second_over.text
    assert scale_over.status_code == 429 and "quota workers of alice" in scale_over.text, scale_over.text
    assert (scale_down.status_code, scale_up.status_code) == (200, 200), (scale_down.text, scale_up.text)

    with manager(tmp_path, **settings) as m:  # a new manager process's state: the same database
        alice, root = _client(m.server.url, tokens["alice"]), _client(m.server.url, tokens["root"])
        kept = root.get("/v1/quotas/alice").json()
        still = alice.post("/v1/jobs", json=queued)
        cleared = root.delete("/v1/quotas/alice")
        after = alice.post("/v1/jobs", json=queued)
        set_nothing = root.put("/v1/quotas/bob", json={})  # replaces with nothing: no policy of bob's stored
        listed = root.get("/v1/quotas").json()
        alice.close()
        root.close()
    assert set_nothing.status_code == 200 and set_nothing.json()["overrides"] == {"weight": None, "quotas": {}}
    assert kept["overrides"]["quotas"] == {"queued_jobs": 1, "workers": 1} and kept["weight"] == 3, kept
    assert still.status_code == 429, still.text
    assert cleared.status_code == 200 and cleared.json()["quotas"]["queued_jobs"] == 5, cleared.text
    assert cleared.json()["overrides"] == {"weight": None, "quotas": {}}
    assert after.status_code == 201, after.text
    assert [u["user"] for u in listed["users"]] == ["alice"]  # the tokens file's quotas still make hers her own
