"""A client generated from the served schema works (issue 28): ``openapi-python-client`` generates a Python client
from a real manager's ``/openapi.json`` at test time, and the main operations go through it against that manager:
register an experiment, start a session, submit a job, follow it to its end on its event stream, download its
model, read its metrics, and read a 422 and a 404 as the typed error models.

The generator's only warnings may be about ``application/yaml`` request bodies (it generates the JSON body of those
operations, which is what a Python client sends); ``application/zip`` is mapped to binary by its configuration
(``content_type_overrides``), as a user of the generator would.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from helpers import experiment_dict, missing, write_dataset
from jobs.manager import manager
from jobs.tiny import tiny_manifest

pytestmark = pytest.mark.slow  # a training job to its end: ~30 s on the loaded 2-core machine

TOKEN = "generated-client-token-0123456789abcdef"
PACKAGE = "labswarm_generated_client"
CONFIG = f"""package_name_override: {PACKAGE}
project_name_override: {PACKAGE}
content_type_overrides:
  application/zip: application/octet-stream
"""


def _generate(schema: dict, folder: Path) -> tuple[ModuleType, str]:
    """Generate the client package of ``schema`` into ``folder`` and import it: ``(package, generator output)``."""
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    if generator is None:
        missing("openapi-python-client is not installed (the dev extra)")
    (folder / "schema.json").write_text(json.dumps(schema))
    (folder / "config.yaml").write_text(CONFIG)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([str(generator), "generate", "--path", "schema.json", "--config", "config.yaml",
                           "--meta", "none", "--output-path", PACKAGE], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return importlib.import_module(PACKAGE), output


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[dict]:
    """A manager, the client generated from its schema, and the generator's output."""
    dataset = write_dataset(tmp_path / "tones", n_per_label=2)
    with manager(tmp_path, api_token=TOKEN, default_rate=0.5) as m:
        schema = httpx.get(f"{m.server.url}/openapi.json", timeout=30).json()  # open, as /docs
        folder = tmp_path / "generated"
        folder.mkdir()
        package, output = _generate(schema, folder)
        try:
            yield {"m": m, "package": package, "output": output, "dataset": dataset, "tmp": tmp_path}
        finally:
            sys.path.remove(str(folder))
            for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
                del sys.modules[name]


def _api(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.api.{name}")


def test_the_generated_client_drives_the_main_operations(generated: dict) -> None:
    m, package, tmp = generated["m"], generated["package"], generated["tmp"]
    warnings = re.findall(r"WARNING parsing (\S+ \S+)[^\n]*\n\s*\n([^\n]+)", generated["output"])
    assert all("application/yaml" in why for _, why in warnings), generated["output"]
    models = importlib.import_module(f"{PACKAGE}.models")
    client = package.AuthenticatedClient(base_url=m.server.url, token=TOKEN, raise_on_unexpected_status=True,
                                         timeout=httpx.Timeout(300.0))
    with client:
        # an experiment and a session
        body = models.PostExperimentJsonBody.from_dict(experiment_dict(generated["dataset"], tmp / "store"))
        created = _api("experiments.post_experiment").sync_detailed(client=client, body=body)
        assert created.status_code == 201 and isinstance(created.parsed, models.Experiment), created.content
        assert created.parsed.name == "tones" and created.parsed.valid
        session = _api("experiments.start_session").sync(name="tones", client=client,
                                                         body=models.SessionBody(rate=0.5))
        assert isinstance(session, models.SessionProgress) and session.status == "running", session
        shown = _api("sessions.get_session").sync(session.id, client=client)
        assert isinstance(shown, models.SessionProgress) and shown.total == session.total > 0
        listed = _api("sessions.list_sessions").sync(client=client)
        assert [s.id for s in listed] == [session.id]
        assert _api("sessions.cancel").sync(session.id, client=client).status == "cancelled"

        # a job, followed on its event stream to its end (the stream closes after the terminal status)
        manifest = models.CreateJsonBody.from_dict(tiny_manifest(tmp, epochs=1))
        submitted = _api("jobs.create").sync_detailed(client=client, body=manifest)
        assert submitted.status_code == 201 and isinstance(submitted.parsed, models.Job), submitted.content
        job = submitted.parsed
        assert job.status in ("queued", "pending") and job.learners == 1
        followed = _api("jobs.stream").sync_detailed(job.id, client=client)
        assert followed.status_code == 200
        assert re.search(r'event: status\ndata: \{[^\n]*"status": ?"completed"', followed.content.decode()), \
            followed.content.decode()[-2000:]
        again = _api("jobs.stream").sync_detailed(job.id, client=client, last_event_id="999999")
        assert again.status_code == 204  # over: an EventSource stops
        done = _api("jobs.show").sync(job.id, client=client)
        assert isinstance(done, models.Job) and done.status == "completed" and done.attempts[0].exit_code == 0
        again = _api("jobs.create").sync_detailed(client=client, body=manifest, reuse=True)  # the same training
        assert again.status_code == 200 and again.parsed.reused and again.parsed.id == job.id, again.content
        page = _api("jobs.list_jobs").sync(client=client)
        assert page.total == 1 and page.jobs[0].id == job.id
        records = _api("jobs.metrics").sync(job.id, client=client).metrics
        assert [r.epoch for r in records] == [1] and records[0].train_loss > 0
        assert "data_wait_s" in records[0].additional_properties  # the open part of a record comes too

        # the model, as bytes
        model = _api("jobs.model").sync_detailed(job.id, client=client)
        assert model.status_code == 200 and model.headers["content-type"] == "application/octet-stream"
        payload = model.parsed.payload.read()
        assert payload[:2] == b"PK" and len(payload) > 1000  # torch.save's zip

        # errors, typed
        bad = models.CreateJsonBody.from_dict(tiny_manifest(tmp, learners=0))
        refused = _api("jobs.create").sync_detailed(client=client, body=bad)
        assert refused.status_code == 422 and isinstance(refused.parsed, models.ValidationError)
        assert [(d.path, bool(d.reason)) for d in refused.parsed.detail] == [("learners", True)]
        missing = _api("jobs.show").sync_detailed("nope", client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, models.Error)
        assert "nope" in missing.parsed.detail
