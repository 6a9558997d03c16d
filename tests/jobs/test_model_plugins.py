"""Model plugins through the manager (issue 25, item 1): the example package's model trains in a job's learner
process and its model predicts; a parameter its config rejects is a 422 naming it; a model from a Python file is
an admin's only (403 naming the field, as ``framework: command``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from example_net import MODEL, ensure_example_net

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest
from labswarm.auth.tokens import add_token
from labswarm.predict import predict


@pytest.fixture(scope="module", autouse=True)
def example_net() -> None:
    ensure_example_net()


def _with_model(manifest: dict, model: dict) -> dict:
    return {**manifest, "experiment": {**manifest["experiment"], "model": model}}


def test_the_example_package_s_model_trains_through_a_job_and_predicts(tmp_path: Path) -> None:
    """~15 s: a real learner process finds the plugin through its entry point."""
    manifest = _with_model(tiny_manifest(tmp_path, epochs=2), {"name": MODEL, "hidden": 16})
    files = [tmp_path / "data" / "low" / "low_3.wav", tmp_path / "data" / "noise" / "noise_5.wav"]
    with manager(tmp_path) as m:
        job = m.submit(manifest)
        assert statuses(read_events(m.http, job["id"]))[-1] == "completed", m.show(job["id"])
        (tmp_path / "model.pt").write_bytes(m.http.get(f"/v1/jobs/{job['id']}/model").content)
    predictions = predict(tmp_path / "model.pt", files)
    assert [p.error for p in predictions] == [None, None]
    assert all(set(p.probabilities) == {"high", "low", "noise"} for p in predictions)


def test_a_parameter_the_plugin_s_config_rejects_is_a_422_naming_it(tmp_path: Path) -> None:
    manifest = _with_model(tiny_manifest(tmp_path), {"name": MODEL, "hidden": 0})
    with manager(tmp_path) as m:
        answers = [m.http.post(route, json=manifest) for route in ("/v1/jobs/validate", "/v1/jobs")]
        good = m.http.post("/v1/jobs/validate", json=_with_model(manifest, {"name": MODEL, "hidden": 8}))
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert "experiment.model.hidden" in answer.text, answer.text
    assert good.status_code == 200, good.text


def test_a_model_from_a_python_file_is_an_admin_s_only(tmp_path: Path) -> None:
    (tmp_path / "my_net.py").write_text("raise SystemExit('never imported by a validation')\n")
    manifest = _with_model(tiny_manifest(tmp_path), {"code": str(tmp_path / "my_net.py") + ":Net"})
    tokens = tmp_path / "tokens.yaml"
    alice, root = add_token(tokens, "alice", "user"), add_token(tokens, "root", "admin")
    with manager(tmp_path, tokens_file=tokens) as m:
        def post(token: str, route: str) -> httpx.Response:
            return m.http.post(route, json=manifest, headers={"Authorization": f"Bearer {token}"})

        refused = [post(alice, route) for route in ("/v1/jobs/validate", "/v1/jobs")]
        admitted = post(root, "/v1/jobs/validate")
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert "experiment.model.code" in answer.json()["detail"], answer.text
    assert admitted.status_code == 200, admitted.text
