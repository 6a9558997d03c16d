"""JobsClient against a real manager: its event reader survives a manager killed and restarted mid-job (every
event once, in order), and the other calls answer as the API does."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from jobs.manager import manager, manager_process
from jobs.test_lifecycle import _UNTIL
from jobs.tiny import tiny_manifest
from labswarm.errors import ManagerError
from labswarm.jobs.client.client import JobsClient
from labswarm.manager.server import free_port


def _manifest(tmp_path: Path, release: Path) -> dict:
    return tiny_manifest(tmp_path, framework={
        "name": "command", "command": [sys.executable, "-c", _UNTIL, str(release), "99"],
        "metrics": {"regex": {"epoch": r"attempt (\d+) started"}}})


def test_the_event_reader_reconnects_across_a_manager_restart_and_misses_nothing(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    managers = [manager_process(home, port, tmp_path / "manager.log")]
    try:
        with JobsClient(f"http://127.0.0.1:{port}") as client:
            job = client.submit(_manifest(tmp_path, tmp_path / "release"))
            seen = []
            for event in client.events(job["id"], reconnect_s=0.2):
                seen.append(event)
                if event["event"] == "metric":  # mid-job: kill the manager, start another, let the job end
                    managers[0].kill()
                    managers[0].wait(30)
                    managers.append(manager_process(home, port, tmp_path / "manager.log"))
                    (tmp_path / "release").touch()
            again = list(client.events(job["id"]))
    finally:
        for process in managers:
            if process.poll() is None:
                process.kill()
            process.wait(30)
    assert [e["id"] for e in seen] == list(range(1, len(seen) + 1))
    assert seen == again
    assert seen[-1]["data"]["status"] == "completed"
    assert "done" in [e["data"]["line"] for e in seen if e["event"] == "log"]


def test_the_client_s_calls(tmp_path: Path) -> None:
    manifest_file = tmp_path / "job.yml"
    manifest = _manifest(tmp_path, tmp_path / "release")
    manifest["results_store"] = {"name": "local", "path": "results"}  # relative to the file
    manifest_file.write_text(yaml.safe_dump(manifest))
    with manager(tmp_path) as m, JobsClient(m.server.url) as client:
        assert client.validate(manifest_file)["valid"]
        job = client.submit(manifest_file)
        assert client.show(job["id"])["name"] == "tiny"
        (tmp_path / "release").touch()
        assert list(client.events(job["id"]))[-1]["data"]["status"] == "completed"
        assert client.metrics(job["id"]) == [{"epoch": 1, "rank": 0, "attempt": 1}]
        assert "done" in [line["line"] for line in client.logs(job["id"], pagesize=2)]
        assert [a["exit_code"] for a in client.attempts(job["id"])] == [0]
        assert client.list(status=["completed"])["total"] == 1
        assert (tmp_path / "results" / "jobs" / job["id"] / "checkpoints").exists() is False
        with pytest.raises(ManagerError) as caught:
            client.download_model(job["id"], tmp_path / "model.pt")  # a command job stores no model
        assert caught.value.status == 404
        with zipfile.ZipFile(client.download_bundle(job["id"], tmp_path / "bundle.zip")) as bundle:
            assert sorted(bundle.namelist()) == ["job.json", "logs/attempt-1/learner-0.log", "manifest.json",
                                                 "metrics.jsonl", "versions.json"]
            assert json.loads(bundle.read("job.json"))["status"] == "completed"
            assert "done" in bundle.read("logs/attempt-1/learner-0.log").decode()
            versions = json.loads(bundle.read("versions.json"))
            assert versions["experiment"] == "three" and len(versions["experiment_fingerprint"]) == 16
            assert versions["feature_store"] == {"layout_version": 1, "key_version": 1}
        with pytest.raises(ManagerError) as caught:
            client.submit({**manifest, "priority": "high"})
        assert caught.value.status == 422 and "priority" in str(caught.value)
        client.delete(job["id"])
        with pytest.raises(ManagerError) as caught:
            client.show(job["id"])
        assert caught.value.status == 404
