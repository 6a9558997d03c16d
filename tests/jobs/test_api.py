"""The jobs API refuses bad input with the field's path (422), unknown jobs with 404: never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.manager import manager
from jobs.tiny import tiny_manifest


@pytest.mark.parametrize(("change", "path"), [
    ({"name": "Not A Name"}, "name"),
    ({"learners": 0}, "learners"),
    ({"restart": {"backoff_s": -1}}, "restart.backoff_s"),
    ({"resources": {"gpus": "many"}}, "resources.gpus"),
    ({"framework": {"name": "tensorflow"}}, "framework.name"),
    ({"framework": {"name": "command", "command": []}}, "framework.command"),
    ({"priority": 10_000}, "priority"),
    ({"experiment": "not-registered"}, "experiment"),
    ({"training": {"epochs": 0}}, "training.epochs"),
    ({"training": {"seed": -1}}, "training.seed"),
    ({"results_store": {"name": "ftp"}}, "results_store.name"),
    ({"results_store": None}, "results_store"),
    ({"surprise": 1}, "surprise"),
])
def test_a_malformed_manifest_is_a_422_naming_the_field(tmp_path: Path, change: dict, path: str) -> None:
    manifest = {**tiny_manifest(tmp_path), **change}
    with manager(tmp_path) as m:
        for route in ("/v1/jobs/validate", "/v1/jobs"):
            answer = m.http.post(route, json=manifest)
            assert answer.status_code == 422, answer.text
            assert path in [d["path"] for d in answer.json()["detail"]], answer.json()
        assert m.http.get("/v1/jobs").json()["total"] == 0


def test_unreachable_stores_and_bad_bodies_fail_fast(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with manager(tmp_path) as m:
        store = {"name": "local", "path": str(tmp_path / "a-file" / "below")}
        answer = m.http.post("/v1/jobs", json=tiny_manifest(tmp_path, results_store=store))
        assert answer.status_code == 422 and answer.json()["detail"][0]["path"] == "results_store"
        answer = m.http.post("/v1/jobs", content=b"name: [unclosed", headers={"Content-Type": "application/yaml"})
        assert answer.status_code == 422 and "invalid YAML" in answer.json()["detail"][0]["reason"]
        assert m.http.post("/v1/jobs", content=b"").status_code == 422
        assert m.http.get("/v1/jobs/nope").status_code == 404
        assert m.http.get("/v1/jobs/nope/events").status_code == 404
        assert m.http.patch("/v1/jobs/nope", json={"status": "halt"}).status_code == 404
        valid = m.http.post("/v1/jobs/validate", json=tiny_manifest(tmp_path))
        assert valid.status_code == 200 and valid.json()["manifest"]["experiment"]["name"] == "three"
        job = m.submit(tiny_manifest(tmp_path, epochs=1))
        assert m.http.patch(f"/v1/jobs/{job['id']}", json={"status": "explode"}).status_code == 422
        assert m.http.get(f"/v1/jobs/{job['id']}/logs", params={"pagesize": 0}).status_code == 422
        listed = m.http.get("/v1/jobs", params={"status": ["queued", "pending", "running"], "name": "tiny"}).json()
        assert listed["total"] == 1 and listed["jobs"][0]["id"] == job["id"]
        assert m.http.delete(f"/v1/jobs/{job['id']}").status_code == 204
