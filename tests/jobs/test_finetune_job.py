"""Fine-tuning from a job (issue 25 item 3): ``training.init_from: {job: ID}`` on a real manager with real learner
processes. A two-class child of a three-class parent job keeps the parent's (frozen) body tensor for tensor and
gets a new output layer; its bundle records the parent model's SHA-256; a job that is not the submitter's, or
does not exist, is a 422 naming the field."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from jobs.manager import manager, read_events, statuses
from jobs.tiny import tiny_manifest


def _two_classes(data: Path, tmp_path: Path) -> Path:
    """The parent's clips with 'high' and 'low' merged into 'tone'."""
    other = tmp_path / "two"
    other.mkdir()
    for sub in ("high", "low", "noise"):
        (other / sub).symlink_to(data / sub)
    labels = (data / "labels.csv").read_text().replace(",high,", ",tone,").replace(",low,", ",tone,")
    (other / "labels.csv").write_text(labels)
    return other


@pytest.mark.slow  # two training jobs (25.7 s in stop 32's CI)
def test_fine_tuning_from_a_job_renews_the_output_layer_and_keeps_the_rest(tmp_path: Path) -> None:
    """~40 s: two jobs of one epoch each, real learner processes."""
    parent_manifest = tiny_manifest(tmp_path, epochs=1)
    child = tiny_manifest(tmp_path, epochs=1, name="child")
    child["experiment"] = {**child["experiment"], "name": "three-as-two",
                           "dataset": {**child["experiment"]["dataset"],
                                       "root": str(_two_classes(tmp_path / "data", tmp_path))}}
    with manager(tmp_path) as m:
        parent = m.submit(parent_manifest)["id"]
        assert statuses(read_events(m.http, parent))[-1] == "completed"
        unknown = m.http.post("/v1/jobs", json={**child, "training": {"init_from": {"job": "0123456789ab"}}})
        forged = m.http.post("/v1/jobs", json={**child, "training": {"init_from": {
            "job": parent, "store": {"name": "local", "path": str(tmp_path)}}}})
        job = m.submit({**child, "training": {"epochs": 1, "learning_rate": 0.05, "freeze": ["features."],
                                              "init_from": {"job": parent}}})["id"]
        assert statuses(read_events(m.http, job))[-1] == "completed", m.http.get(f"/v1/jobs/{job}/logs").text
        parent_bytes = m.http.get(f"/v1/jobs/{parent}/model").content
        child_bytes = m.http.get(f"/v1/jobs/{job}/model").content
        bundle = zipfile.ZipFile(io.BytesIO(m.http.get(f"/v1/jobs/{job}/bundle").content))
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["path"] == "training.init_from.job"
    assert "no job '0123456789ab'" in unknown.json()["detail"][0]["reason"]
    assert forged.status_code == 422 and forged.json()["detail"][0]["path"] == "training.init_from"

    before = torch.load(io.BytesIO(parent_bytes), weights_only=True)
    after = torch.load(io.BytesIO(child_bytes), weights_only=True)
    head = ("head.2.weight", "head.2.bias")
    assert before["classes"] == ["high", "low", "noise"] and after["classes"] == ["noise", "tone"]
    assert before["state_dict"][head[0]].shape[0] == 3 and after["state_dict"][head[0]].shape[0] == 2
    body = [k for k in before["state_dict"] if k.startswith("features.") and k.endswith(("weight", "bias"))]
    assert body and all(torch.equal(after["state_dict"][k], before["state_dict"][k]) for k in body)
    digest = hashlib.sha256(parent_bytes).hexdigest()
    assert after["init_from"]["job"] == parent and after["init_from"]["sha256"] == digest
    assert set(after["init_from"]["fresh"]) == set(head)
    versions = json.loads(bundle.read("versions.json"))
    assert versions["parent_model"] == {"job": parent, "sha256": digest}
    manifest = json.loads(bundle.read("manifest.json"))
    assert manifest["training"]["init_from"]["job"] == parent and manifest["training"]["freeze"] == ["features."]
