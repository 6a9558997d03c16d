"""A property-based run of the manager's whole OpenAPI schema (schemathesis): every operation, authenticated, over
real HTTP against a real manager (uvicorn in a thread, SQLite, the embedded broker), must never answer 5xx.

Path parameters name the objects the fixture created (an experiment, a running session) in about half of the
cases, drawn ones otherwise, so operations reach their handlers instead of answering 404 only (the RUNBOOK's
note). Examples per operation are bounded (``MAX_EXAMPLES``) and derandomized: the same cases run every time, and
the whole run stays within ~60 s on the 2-core CI machine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from helpers import experiment_dict, write_dataset
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core import NotSet

from labswarm.manager.api import create_app
from labswarm.manager.server import EmbeddedServer
from labswarm.settings import Settings

TOKEN = "schema-fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Examples per operation and mode, valid and invalid input (33 operations): bounded for CI time.
MAX_EXAMPLES = 6
#: Seconds a request may take: the event streams of a live session never end by themselves.
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A manager with one registered experiment and one running (slow) session: their ids, and its URL."""
    tmp = tmp_path_factory.mktemp("fuzz")
    dataset = write_dataset(tmp / "data", n_per_label=2)
    server = EmbeddedServer(create_app(Settings(home=tmp / "home", api_token=TOKEN, data_roots=[tmp],
                                                default_rate=0.5))).start()
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=TIMEOUT) as http:
            created = http.post("/experiments", json=experiment_dict(dataset, tmp / "store", name="fuzz"))
            assert created.status_code == 201, created.text
            session = http.post("/experiments/fuzz/sessions", json={"rate": 0.5})
            assert session.status_code == 201, session.text
        yield {"url": server.url, "name": "fuzz", "session_id": session.json()["id"]}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def manager_schema(manager: dict[str, Any]):
    return schemathesis.openapi.from_url(f"{manager['url']}/openapi.json")


def _known_ids(case, manager: dict[str, Any]) -> None:
    """Name the fixture's objects in about half of the cases (chosen by the case's own content: deterministic)."""
    if not case.path_parameters or case.path.endswith("/events"):  # a live stream would run until TIMEOUT
        return
    digest = hashlib.blake2b(repr(sorted(case.path_parameters.items())).encode(), digest_size=1).digest()[0]
    if digest % 2:
        for key in ("name", "session_id"):
            if key in case.path_parameters:
                case.path_parameters[key] = manager[key]


def _server_errors(operation, mode: GenerationMode, manager: dict[str, Any]) -> str | None:
    """Run ``MAX_EXAMPLES`` cases of ``operation`` in ``mode`` (valid or invalid input); the first (shrunk) one
    answered 5xx, described, or ``None``."""

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case) -> None:
        _known_ids(case, manager)
        response = case.call(base_url=manager["url"], headers=AUTH, timeout=TIMEOUT)
        body = json.dumps(case.body, default=repr)[:500] if not isinstance(case.body, NotSet) else None
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} ({mode.value}) -> {response.status_code}: query={case.query!r} "
            f"headers={case.headers!r} body={body}\n{response.text[:2000]}")

    try:
        run()
    except AssertionError as exc:
        return str(exc)
    except Unsatisfiable:  # no invalid input exists: GET /health has no parameter, no body and no security
        if mode is GenerationMode.POSITIVE or operation.path != "/health":
            raise
    return None


def _fuzz(manager_schema, manager: dict[str, Any]) -> list[str]:
    """The 5xx answers of every operation."""
    errors = []
    operations = [result.ok() for result in manager_schema.get_all_operations()]
    assert len(operations) >= 30
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if (error := _server_errors(operation, mode, manager)) is not None:
                errors.append(error)
    return errors


def test_no_operation_answers_5xx(manager_schema, manager: dict[str, Any]) -> None:
    """(schemathesis 4's pytest plugin does not run under pytest 9: its strategies are driven here directly.)"""
    errors = _fuzz(manager_schema, manager)
    assert not errors, "\n\n".join(errors)


def test_the_run_covers_every_operation(manager_schema) -> None:
    """Every route of the app is in the schema the fuzzer reads (a route left out of it would not be fuzzed)."""
    operations = {(method.upper(), path) for path, ops in manager_schema.raw_schema["paths"].items()
                  for method in ops if method != "parameters"}
    assert len(operations) >= 30 and ("POST", "/sessions/{session_id}/outcomes") in operations, operations


def test_a_5xx_would_fail_the_run(tmp_path: Path) -> None:
    """The check above can fail: a route that raises is answered 500 by the same app assembly."""
    app = create_app(Settings(home=tmp_path / "home", api_token=TOKEN))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    server = EmbeddedServer(app).start()
    try:
        assert httpx.get(f"{server.url}/boom", headers=AUTH, timeout=TIMEOUT).status_code == 500
    finally:
        server.stop()
