"""The typed success answers of the OpenAPI schema are what the manager sends (issue 28): a real manager (uvicorn,
SQLite, the embedded broker) is driven through every typed operation, a tiny training job to its end included,
and each answer is checked against the schema the manager serves (closed objects: a field the server sends and
the schema does not declare fails, as does a declared required one it does not send)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from helpers import experiment_dict, write_dataset
from jobs.manager import manager, wait_until
from jobs.tiny import tiny_manifest

from labswarm.manager.responses import RESPONSES

pytestmark = pytest.mark.slow  # a training job to its end: ~30 s on the loaded 2-core machine

TOKEN = "response-models-token-0123456789abcdef"


class Contract:
    """The served schema: checks an answer against what it declares for its operation."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.operations = {op["operationId"]: op for item in schema["paths"].values() for op in item.values()}
        text = json.dumps(schema["components"]["schemas"]).replace("#/components/schemas/", "#/$defs/")
        self.defs = json.loads(text)
        self.checked: set[str] = set()

    def check(self, op_id: str, response: httpx.Response) -> Any:
        assert response.status_code in (200, 201), (op_id, response.status_code, response.text)
        declared = self.operations[op_id]["responses"][str(response.status_code)]["content"]["application/json"]
        schema = json.loads(json.dumps(declared["schema"]).replace("#/components/schemas/", "#/$defs/"))
        jsonschema.validate(response.json(), {**schema, "$defs": self.defs},
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        self.checked.add(op_id)
        return response.json()


def test_every_typed_answer_is_what_the_server_sends(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "tones", n_per_label=2)
    with manager(tmp_path, api_token=TOKEN, default_rate=0.5) as m:
        m.http.headers["Authorization"] = f"Bearer {TOKEN}"
        contract = Contract(m.http.get("/openapi.json").json())
        check = contract.check
        check("health", httpx.get(f"{m.server.url}/health"))
        check("worker_settings", m.http.get("/settings"))
        check("set_quotas", m.http.put("/v1/quotas/alice", json={"weight": 2, "quotas": {"workers": 1}}))
        check("show_quotas", m.http.get("/v1/quotas/alice"))
        check("list_quotas", m.http.get("/v1/quotas"))
        check("clear_quotas", m.http.delete("/v1/quotas/alice"))
        check("post_experiment", m.http.post("/experiments",
                                             json=experiment_dict(dataset, tmp_path / "store", name="tones")))
        check("list_experiments", m.http.get("/experiments"))
        check("get_experiment", m.http.get("/experiments/tones"))
        session = check("start_session", m.http.post("/experiments/tones/sessions", json={"rate": 0.5}))
        sid = session["id"]
        check("get_session", m.http.get(f"/sessions/{sid}"))
        check("put_rate", m.http.put(f"/sessions/{sid}/rate", json={"rate": 1.0}))
        check("put_weight", m.http.put(f"/sessions/{sid}/weight", json={"weight": 2.0}))
        check("pause", m.http.post(f"/sessions/{sid}/pause"))
        check("resume", m.http.post(f"/sessions/{sid}/resume"))
        sample = "missing/sample.wav"
        check("redeliveries", m.http.post(f"/sessions/{sid}/redeliveries", json={"sample_id": sample}))
        answer = check("outcomes", m.http.post(f"/sessions/{sid}/outcomes", json={"outcomes": [
            {"sample_id": sample, "status": "failed", "reason": "not one of the session's"}]}))
        assert answer["rejected"], answer  # a rejected outcome: the nested model is checked too
        check("failures", m.http.get(f"/sessions/{sid}/failures"))
        check("cancel", m.http.post(f"/sessions/{sid}/cancel"))
        assert check("list_sessions", m.http.get("/sessions"))[0]["status"] == "cancelled"

        manifest = tiny_manifest(tmp_path, epochs=1)
        check("validate", m.http.post("/v1/jobs/validate", json=manifest))
        job = check("create", m.http.post("/v1/jobs", json=manifest))
        wait_until(lambda: m.show(job["id"])["status"] in ("completed", "failed"), 240, "the job's end")
        shown = check("show", m.http.get(f"/v1/jobs/{job['id']}"))
        assert shown["status"] == "completed", shown
        check("list_jobs", m.http.get("/v1/jobs"))
        assert check("attempts", m.http.get(f"/v1/jobs/{job['id']}/attempts"))["attempts"][0]["learners"]
        assert check("logs", m.http.get(f"/v1/jobs/{job['id']}/logs"))["lines"]
        records = check("metrics", m.http.get(f"/v1/jobs/{job['id']}/metrics"))["metrics"]
        assert records and records[0]["epoch"] == 1 and records[0]["train_loss"] > 0
        second = m.submit(manifest)
        check("change", m.http.patch(f"/v1/jobs/{second['id']}", json={"status": "halt"}))
    # not checked on a real answer: report (a learner's, with its attempt's token), put_workers (a launcher)
    assert contract.checked == set(RESPONSES) - {"report", "put_workers"}, set(RESPONSES) - contract.checked


def test_a_field_the_schema_does_not_declare_fails_the_check() -> None:
    """The check above can fail: an answer with one more field, or one less, is refused."""
    from labswarm.manager.schema import response_schemas

    components, by_operation = response_schemas()
    schema = {**by_operation["redeliveries"], "$defs": json.loads(
        json.dumps(components).replace("#/components/schemas/", "#/$defs/"))}
    schema = json.loads(json.dumps(schema).replace("#/components/schemas/", "#/$defs/"))
    jsonschema.validate({"run": True}, schema)
    for wrong in ({"run": True, "new": 1}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
