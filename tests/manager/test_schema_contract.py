"""The manager's OpenAPI schema is the contract (issue 28): served by a real manager with a token, it declares
the bodies the handlers read themselves, the one error model the manager really sends, the error statuses, the
real media types and stable operation ids, and a real 422 body validates against what it declares."""

from __future__ import annotations

from pathlib import Path

import httpx
import jsonschema
from openapi_spec_validator import validate

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

TOKEN = "schema-contract-token-0123456789abcdef"
#: The operation ids: a rename or a removal is a breaking change for generated clients, so it shows here (a new
#: operation is not: the set only has to be among the served ones).
OPERATION_IDS = {
    "attempts", "bundle", "cancel", "change", "create", "delete", "describe_model", "failures", "get_config",
    "get_experiment", "predict",
    "get_session", "health", "list_experiments", "list_jobs", "list_sessions", "logs", "metrics", "model",
    "outcomes", "pause", "post_experiment", "prometheus_metrics", "put_rate", "put_weight", "put_workers",
    "redeliveries", "report", "resume", "session_events", "show", "start_session", "stream", "validate",
    "worker_settings",
}


def _resolved(schema: dict, components: dict) -> dict:
    """``schema`` as a JSON schema that jsonschema can check alone (the components as ``$defs``)."""
    import json

    text = json.dumps(schema).replace("#/components/schemas/", "#/$defs/")
    return {**json.loads(text), "$defs": json.loads(json.dumps(components).replace("#/components/schemas/",
                                                                                   "#/$defs/"))}


def test_the_served_schema_is_the_contract(tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path / "home", api_token=TOKEN))
    server = EmbeddedServer(app).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            schema = http.get("/openapi.json").json()
            invalid = http.post("/experiments", json={"name": 3})
            health = httpx.get(f"{server.url}/health")  # no token
    finally:
        server.stop()
    validate(schema)
    operations = {op["operationId"]: (path, method, op) for path, item in schema["paths"].items()
                  for method, op in item.items()}
    assert set(operations) >= OPERATION_IDS, OPERATION_IDS - set(operations)
    assert all(op.get("tags") for _, _, op in operations.values())
    for op in ("post_experiment", "create", "validate"):
        content = operations[op][2]["requestBody"]["content"]
        assert {"application/json", "application/yaml"} <= set(content), op
    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components  # FastAPI's {loc, msg, type}: never sent
    for op_id, (path, _method, op) in operations.items():
        responses = op["responses"]
        if path == "/health":
            assert op["security"] == [] and "401" not in responses
            continue
        assert responses["401"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        if "{" in path:
            assert "404" in responses, op_id
        if "422" in responses:
            assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ValidationError")
    assert "413" in operations["post_experiment"][2]["responses"]
    assert "409" in operations["change"][2]["responses"] and "403" in operations["create"][2]["responses"]
    assert set(operations["model"][2]["responses"]["200"]["content"]) == {"application/octet-stream"}
    assert set(operations["bundle"][2]["responses"]["200"]["content"]) == {"application/zip"}
    for op in ("stream", "session_events"):
        responses = operations[op][2]["responses"]
        assert set(responses["200"]["content"]) == {"text/event-stream"} and "204" in responses
        assert "400" in responses
    # a real 422 is what the schema declares
    assert invalid.status_code == 422
    declared = operations["post_experiment"][2]["responses"]["422"]["content"]["application/json"]["schema"]
    jsonschema.validate(invalid.json(), _resolved(declared, components))
    assert health.status_code == 200
